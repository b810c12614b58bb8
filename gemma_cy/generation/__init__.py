"""Turning an engine into text: ``engines`` (an engine by name), ``sampling``
(SplitMix64 and the samplers, docs/generation.md#sampler) and ``generator``
(the streaming loop: prompt, sampling, stop rules, UTF-8-safe detokenizing).
Engine-agnostic: the same loop drives the reference and the fast engine."""
