"""The fast engine: ``engine.FastEngine`` drives ``FastModel``, the whole forward
pass in Cython (``forward.pxi``), over the kernels of one SIMD module
(``simd_<isa>``, built from ``kernels/``) that ``ops`` picks at import from the
CPU's features (``cpu_features``). ``arena`` lays the streamed matrices out for
decode. docs/architecture.md#the-fast-engine."""
