"""GRPO for language models (lessons 05–07): tokenizer, tiny models, tasks, sampling, SFT, GRPO."""
