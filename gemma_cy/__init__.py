"""gemma-cy: a readable CPU inference engine for Gemma-family models."""
