"""AutoAugment on the device, per image, without reading any choice back to the host.

torchvision's policy tables, operations and magnitudes (``v2.AutoAugment``), sampled per image: every image
draws its own sub-policy, each of its two operations fires with its own probability and signed operations
draw their own sign. The draw is three tensors; each operation kind of a slot is then applied with per-image
parameters gathered from tables built once per image size (affine matrices, brightness factors, posterize
masks, solarize thresholds; the blends Color, Contrast and Sharpness once per magnitude). On CUDA every kind
runs on the whole batch and ``torch.where`` keeps, per image, the kind it drew, so no step reads a value back
to the host; on the CPU only the images that drew a kind are transformed. Each kind repeats
torchvision's kernel arithmetic (the same float operations, the same matrices), so an image gets what
torchvision's operation gives it for the same draw.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.transforms.v2 import AutoAugment as TorchvisionAutoAugment
from torchvision.transforms.v2 import AutoAugmentPolicy, InterpolationMode
from torchvision.transforms.v2 import functional as TF
from torchvision.transforms.v2.functional._geometry import _affine_parse_args, _get_inverse_affine_matrix

AFFINE = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")
KINDS = ("Identity", "affine", "Brightness", "Color", "Contrast", "Sharpness", "Posterize", "Solarize",
         "AutoContrast", "Equalize", "Invert")
# blends whose torchvision kernels scale by a Python float with ``add_(alpha=...)`` (fused differently per
# device): applied with torchvision's own kernel once per magnitude, so they match it exactly everywhere
BLENDS = {"Color": TF.adjust_saturation, "Contrast": TF.adjust_contrast, "Sharpness": TF.adjust_sharpness}
POLICIES = {"cifar10": AutoAugmentPolicy.CIFAR10, "imagenet": AutoAugmentPolicy.IMAGENET,
            "svhn": AutoAugmentPolicy.SVHN}


def _kind(name: str) -> int:
    return KINDS.index("affine" if name in AFFINE else name)


def _inverse_matrix(name: str, magnitude: float, height: int, width: int) -> list[float]:
    """The inverse affine matrix torchvision's AutoAugment builds for ``name`` at ``magnitude``."""
    if name == "Rotate":
        angle = magnitude % 360
        return _get_inverse_affine_matrix([0.0, 0.0], -angle, [0.0, 0.0], 1.0, [0.0, 0.0])
    shear = {"ShearX": [math.degrees(math.atan(magnitude)), 0.0],
             "ShearY": [0.0, math.degrees(math.atan(magnitude))]}.get(name, [0.0, 0.0])
    translate = {"TranslateX": [int(magnitude), 0], "TranslateY": [0, int(magnitude)]}.get(name, [0, 0])
    center = [0, 0] if name.startswith("Shear") else None
    angle, translate, shear, center = _affine_parse_args(0.0, translate, 1.0, shear, InterpolationMode.NEAREST,
                                                         center)
    center_f = [0.0, 0.0] if center is None else [c - s * 0.5 for c, s in zip(center, [width, height], strict=True)]
    return _get_inverse_affine_matrix(center_f, angle, [float(t) for t in translate], 1.0, shear)


class _SlotTables:
    """Per (sub-policy, sign) parameters of one slot's operation at one image size, on one device."""

    def __init__(self, tv: TorchvisionAutoAugment, policies, slot: int, height: int, width: int,
                 device: torch.device):
        n = len(policies)
        kinds, probs, signed, thetas = [], [], [], torch.zeros(n, 2, 2, 3, dtype=torch.float64)
        ratio, ids = torch.ones(n, 2, dtype=torch.float64), torch.zeros(n, 2, dtype=torch.long)
        masks, thresholds = torch.full((n,), 255, dtype=torch.uint8), torch.zeros(n, dtype=torch.float64)
        thetas[..., 0, 0] = thetas[..., 1, 1] = 1.0
        self.entries: list[tuple[str, float]] = []  # the distinct (operation, signed magnitude) of the slot
        for i, policy in enumerate(policies):
            name, prob, bin_index = policy[slot]
            magnitudes_fn, is_signed = tv._AUGMENTATION_SPACE[name]
            magnitudes = magnitudes_fn(10, height, width)
            value = float(magnitudes[bin_index]) if magnitudes is not None and bin_index is not None else 0.0
            kinds.append(_kind(name))
            probs.append(prob)
            signed.append(is_signed)
            for s, magnitude in enumerate((value, -value if is_signed else value)):
                if (name, magnitude) not in self.entries:
                    self.entries.append((name, magnitude))
                ids[i, s] = self.entries.index((name, magnitude))
                if name in AFFINE:
                    thetas[i, s] = torch.tensor(_inverse_matrix(name, magnitude, height, width),
                                                dtype=torch.float64).reshape(2, 3)
                ratio[i, s] = 1.0 + magnitude  # Brightness: torchvision's factor (double, cast in its kernel)
            if name == "Posterize":
                bits = int(value)
                masks[i] = 255 if bits >= 8 else ((1 << bits) - 1) << (8 - bits)
            thresholds[i] = 255 * value  # Solarize: torchvision's bound * magnitude
        self.kinds = torch.tensor(kinds, device=device)
        self.present = sorted(set(kinds))
        self.probs = torch.tensor(probs, dtype=torch.float32, device=device)
        self.signed = torch.tensor(signed, device=device)
        self.ids = ids.to(device)
        # torchvision's _affine_grid: the inverse matrix transposed and divided by the half sides (float32)
        rescaled = thetas.float().transpose(-1, -2).div(torch.tensor([0.5 * width, 0.5 * height]))
        self.thetas, self.ratio = rescaled.to(device), ratio.float().to(device)
        base = torch.empty(1, height, width, 3)
        base[..., 0].copy_(torch.linspace((1.0 - width) * 0.5, (width - 1.0) * 0.5, steps=width))
        base[..., 1].copy_(torch.linspace((1.0 - height) * 0.5, (height - 1.0) * 0.5, steps=height).unsqueeze_(-1))
        base[..., 2].fill_(1)
        self.base_grid = base.view(1, height * width, 3).to(device)
        self.masks, self.thresholds = masks.to(device), thresholds.float().to(device)


class AutoAugment:
    """AutoAugment with torchvision's policy tables and operations, sampled per image, on the device.

    ``draw`` makes the per-image choices (sub-policy, firing, sign) as device tensors; ``apply`` applies
    them; calling the object does both. ``last_draw`` keeps the last batch's draw and ``applied()`` reads it
    back as each image's (operation, magnitude) list, for inspection and tests (off the training path).
    """

    def __init__(self, policy: str = "cifar10", fill: int = 128, branch_free: bool | None = None):
        if policy not in POLICIES:
            raise ValueError(f"AutoAugment policy {policy!r} is unknown; use one of {', '.join(POLICIES)}")
        self._tv = TorchvisionAutoAugment(POLICIES[policy], fill=fill)
        self.policies = self._tv._policies
        self.fill = float(fill)
        self.branch_free = branch_free  # None: on CUDA only (whole-batch kinds selected by torch.where)
        self._tables: dict[tuple[int, int, str], tuple[_SlotTables, _SlotTables]] = {}
        self.last_draw: tuple[Tensor, Tensor, Tensor] | None = None
        self._last_size = (32, 32)

    def tables(self, height: int, width: int, device: torch.device) -> tuple[_SlotTables, _SlotTables]:
        key = (height, width, str(device))
        if key not in self._tables:
            self._tables[key] = tuple(_SlotTables(self._tv, self.policies, slot, height, width, device)
                                      for slot in (0, 1))
        return self._tables[key]

    def draw(self, batch: int, generator: torch.Generator, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """Sub-policy index (B,), firing uniforms (B, 2) and negative-sign flags (B, 2), in the order the
        per-image draws have always been made (so a generator gives the same choices as before)."""
        choice = torch.randint(len(self.policies), (batch,), generator=generator, device=device)
        fire = torch.rand((batch, 2), generator=generator, device=device)
        negative = torch.rand((batch, 2), generator=generator, device=device) < 0.5
        return choice, fire, negative

    def __call__(self, images: Tensor, generator: torch.Generator) -> Tensor:
        if images.dtype != torch.uint8:
            raise ValueError("AutoAugment works on uint8 images; apply it before normalisation")
        self.last_draw = self.draw(images.shape[0], generator, images.device)
        self._last_size = tuple(images.shape[-2:])
        return self.apply(images, *self.last_draw)

    def apply(self, images: Tensor, choice: Tensor, fire: Tensor, negative: Tensor) -> Tensor:
        """uint8 (B, C, H, W) -> uint8: each image's first operation of its sub-policy, then its second."""
        out = images
        branch_free = images.device.type != "cpu" if self.branch_free is None else self.branch_free
        for slot, tables in enumerate(self.tables(*images.shape[-2:], images.device)):
            fires = fire[:, slot] <= tables.probs[choice]
            sign = (negative[:, slot] & tables.signed[choice]).long()
            kind = torch.where(fires, tables.kinds[choice], 0)
            entry = torch.where(fires, tables.ids[choice, sign], -1)
            result = out.clone()
            for k in tables.present:
                name = KINDS[k]
                if name in BLENDS:  # one pass per magnitude: torchvision's own scalar kernels
                    for e, (entry_name, magnitude) in enumerate(tables.entries):
                        if entry_name == name:
                            _put(result, out, entry == e, lambda x, c, s, f=BLENDS[name], m=magnitude: f(x, 1.0 + m),
                                 choice, sign, branch_free)
                elif name != "Identity":
                    _put(result, out, kind == k, partial(self._kind, name, tables=tables), choice, sign,
                         branch_free)
            out = result
        return out

    def _kind(self, name: str, x: Tensor, choice: Tensor, sign: Tensor, tables: _SlotTables) -> Tensor:
        """Operation kind ``name`` on images ``x`` with each image's own parameters (``choice``, ``sign``:
        its sub-policy and sign) in torchvision's arithmetic for uint8 images."""
        t = tables
        per_image = (-1, 1, 1, 1)
        if name == "affine":
            return _affine(x, t.base_grid, t.thetas[choice, sign], self.fill)
        if name == "Brightness":
            return x.mul(t.ratio[choice, sign].view(per_image)).clamp_(0, 255).to(torch.uint8)
        if name == "Posterize":
            return x & t.masks[choice].view(per_image)
        if name == "Solarize":
            return torch.where(x >= t.thresholds[choice].view(per_image), x.bitwise_not(), x)
        if name == "AutoContrast":
            return _autocontrast(x)
        if name == "Equalize":
            return TF.equalize(x)
        if name == "Invert":
            return x.bitwise_not()
        raise ValueError(f"AutoAugment operation {name!r} has no batched kernel")

    def applied(self) -> list[list[tuple[str, float]]]:
        """The last batch's operations per image as (name, signed magnitude); reads the draw back."""
        if self.last_draw is None:
            return []
        choice, fire, negative = (t.tolist() for t in self.last_draw)
        result = []
        for i, c in enumerate(choice):
            ops = []
            for slot, (name, prob, bin_index) in enumerate(self.policies[c]):
                if fire[i][slot] > prob:
                    continue
                magnitudes_fn, signed = self._tv._AUGMENTATION_SPACE[name]
                magnitudes = magnitudes_fn(10, *self._last_size)
                value = float(magnitudes[bin_index]) if magnitudes is not None and bin_index is not None else 0.0
                ops.append((name, -value if signed and negative[i][slot] else value))
            result.append(ops)
        return result


def _put(result: Tensor, source: Tensor, mask: Tensor, kernel: Callable[[Tensor, Tensor, Tensor], Tensor],
         choice: Tensor, sign: Tensor, branch_free: bool) -> None:
    """``result[i] = kernel(source)[i]`` where ``mask[i]``. ``branch_free``: the kernel runs on the whole batch
    and ``torch.where`` selects (no host read; CUDA); otherwise only the selected images are transformed
    (the CPU, where reading the mask back costs nothing). The same kernel either way, so the same values."""
    if not branch_free:
        index = mask.nonzero().squeeze(1)
        if len(index):
            result[index] = kernel(source[index], choice[index], sign[index])
        return
    result.copy_(torch.where(mask[:, None, None, None], kernel(source, choice, sign), result))


def _affine(images: Tensor, base_grid: Tensor, rescaled: Tensor, fill: float) -> Tensor:
    """torchvision's affine / rotate kernel (nearest, constant fill, same output size) with one rescaled
    inverse matrix (B, 3, 2) per image; ``base_grid`` (1, H * W, 3) as torchvision's ``_affine_grid`` builds it."""
    b, c, h, w = images.shape
    grid = torch.matmul(base_grid, rescaled).view(b, h, w, 2)
    x = torch.cat((images.float(), torch.ones(b, 1, h, w, device=images.device)), dim=1)
    x = F.grid_sample(x, grid, mode="nearest", padding_mode="zeros", align_corners=False)
    x, mask = torch.tensor_split(x, indices=(-1,), dim=-3)
    x = torch.where(mask.expand_as(x) < 0.5, torch.full_like(x, fill), x)
    return x.round_().to(torch.uint8)


def _autocontrast(images: Tensor) -> Tensor:
    """torchvision's autocontrast for uint8, with ``torch.where`` in place of its boolean-mask writes (which
    synchronise with the host on CUDA)."""
    x = images.to(torch.float32)
    minimum = x.amin(dim=(-2, -1), keepdim=True)
    maximum = x.amax(dim=(-2, -1), keepdim=True)
    flat = maximum == minimum
    inv_scale = torch.where(flat, 1.0, (maximum - minimum).mul_(1.0 / 255))
    minimum = torch.where(flat, 0.0, minimum)
    return x.sub_(minimum).div_(inv_scale).clamp_(0, 255).to(torch.uint8)
