"""Writing a model out for other libraries: a timm checkpoint, a Hugging Face ``save_pretrained`` folder."""
