"""Packaged data files: ``prompts.jsonl`` (the prompt set, read via ``sglang_ssd.prompts``)."""
