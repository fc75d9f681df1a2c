"""Command-line tools: ``rocm-mla doctor`` (self-check) and ``rocm-mla isa-report``."""
