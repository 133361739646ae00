"""Model construction and loading: the tiny model factory, Hugging Face loading helpers, LoRA."""
