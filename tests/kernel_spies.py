"""A build of the native kernels that records which of them ran, for tests that check which path a call took.

Hand it to ``fast_paths(kernels=...)``; no module global is patched."""

from vitscope.attention import native


class CountingKernels(native.NativeKernels):
    """``NativeKernels`` that append "kind forward", "kind backward" or "softmax_locality" to ``calls``."""

    def __init__(self, **options):
        super().__init__(**options)
        self.calls: list[str] = []

    def forward(self, kind, *args, **kwargs):
        self.calls.append(f"{kind} forward")
        return super().forward(kind, *args, **kwargs)

    def backward(self, kind, *args, **kwargs):
        self.calls.append(f"{kind} backward")
        return super().backward(kind, *args, **kwargs)

    def softmax_locality(self, *args, **kwargs):
        self.calls.append("softmax_locality")
        return super().softmax_locality(*args, **kwargs)
