"""The outside world: model files, tokenizers and chat templates."""
