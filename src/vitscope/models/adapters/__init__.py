"""Models of other libraries (timm, Hugging Face transformers, OpenCLIP) given vitscope's model contract."""
