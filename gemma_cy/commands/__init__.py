"""The ``gemma-cy`` command line and its subcommands (``cli``), the engine diff
(``diff``), format conversion (``convert``), the packaged default models
(``default_model``) and the synthetic GMW1 presets (``presets``)."""
