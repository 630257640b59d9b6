"""K Vision Transformers of one architecture as one packed model with a leading model dimension.

Every weight of the K members is stacked into one tensor (K, *shape) and the forward pass runs all members
at once with batched matrix products (``torch.baddbmm``); attention folds the model dimension into the
batch, so any normaliser (native kernels and custom ops included) sees an ordinary (K * B, heads, T, T)
problem. Member k's output equals ``models[k](images[k])`` up to float rounding.

``VmappedModels`` is the readable twin built on ``torch.func`` (``stack_module_state`` + ``functional_call``
+ ``vmap``); the benchmark ``bench_train.py --pack K`` measures both.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitscope.attention.module import masked_logits
from vitscope.models.own.vit import VisionTransformer


def check_packable(models: Sequence[VisionTransformer]) -> None:
    """A ValueError naming the reason when ``models`` cannot be packed (architectures differ, dropout on,
    or a normaliser with its own parameters)."""
    if not models:
        raise ValueError("a pack needs at least one model")
    cfg = models[0].cfg
    for k, model in enumerate(models):
        if not isinstance(model, VisionTransformer):
            raise ValueError(f"pack member {k} is a {type(model).__name__}; only vitscope VisionTransformers pack")
        if model.cfg != cfg:
            raise ValueError(f"pack member {k} has config {model.cfg}, member 0 has {cfg}; "
                             "only models of one architecture pack")
    if cfg.cls_specialization:
        raise ValueError("cls_specialization=True: packed models have no CLS path; train these runs unpacked "
                         "(--pack 1)")
    for name in ("drop_rate", "attn_drop_rate", "drop_path_rate"):
        if getattr(cfg, name) > 0:
            raise ValueError(f"{name}={getattr(cfg, name)}: packed models have no per-member dropout streams; "
                             f"set {name}=0 or train these runs unpacked (--pack 1)")
    for block in models[0].blocks:
        if any(True for _ in block.attn.normalizer.parameters()):
            raise ValueError(f"attention={cfg.attention!r} has learned parameters; pack only fixed normalisers "
                             "(softmax, sparsemax, entmax15, entmax:ALPHA) or train unpacked (--pack 1)")


def _slot(name: str) -> str:
    return name.replace(".", "__")


class PackedViT(nn.Module):
    """``K`` VisionTransformers as one module: images (K, B, C, H, W) -> logits (K, B, classes).

    Parameters keep the members' names with a leading K dimension (``param(name)`` is (K, *shape));
    ``unpack_into(k, model)`` and ``pack_from(k, model)`` move one member's weights out and in.
    """

    def __init__(self, models: Sequence[VisionTransformer]):
        super().__init__()
        check_packable(models)
        self.cfg = models[0].cfg
        self.num_models = len(models)
        self.names = [name for name, _ in models[0].named_parameters()]
        self.stacked = nn.ParameterDict({
            _slot(name): nn.Parameter(torch.stack([dict(m.named_parameters())[name].detach() for m in models]))
            for name in self.names})
        for name, _ in models[0].named_buffers():
            self.register_buffer(_slot(name), torch.stack([dict(m.named_buffers())[name] for m in models]),
                                 persistent=False)
        self._normalizers = [block.attn.normalizer for block in models[0].blocks]  # parameter-free, shared

    def param(self, name: str) -> Tensor:
        """The stacked tensor (K, *shape) of the members' parameter (or buffer) ``name``."""
        slot = _slot(name)
        return self.stacked[slot] if slot in self.stacked else getattr(self, slot)

    @torch.no_grad()
    def unpack_into(self, k: int, model: VisionTransformer) -> VisionTransformer:
        """Copy member ``k``'s weights into ``model`` (same architecture); returns it."""
        for name, param in model.named_parameters():
            param.copy_(self.param(name)[k])
        return model

    @torch.no_grad()
    def pack_from(self, k: int, model: VisionTransformer) -> None:
        """Copy ``model``'s weights into member slot ``k``."""
        for name, param in model.named_parameters():
            self.param(name)[k].copy_(param)

    def _linear(self, x: Tensor, name: str) -> Tensor:
        """(K, ..., D_in) -> (K, ..., D_out) with member k's weight (K, D_out, D_in) and bias."""
        weight, shape = self.param(f"{name}.weight"), x.shape
        flat = x.reshape(shape[0], -1, shape[-1])
        bias_name = f"{name}.bias"
        if _slot(bias_name) in self.stacked:
            out = torch.baddbmm(self.param(bias_name)[:, None, :].to(flat.dtype), flat, weight.transpose(1, 2).to(
                flat.dtype))
        else:
            out = torch.bmm(flat, weight.transpose(1, 2).to(flat.dtype))
        return out.reshape(*shape[:-1], weight.shape[1])

    def _layer_norm(self, x: Tensor, name: str) -> Tensor:
        """LayerNorm (eps 1e-6) over the last dimension with member k's affine weight and bias."""
        weight, bias = self.param(f"{name}.weight"), self.param(f"{name}.bias")
        view = (x.shape[0],) + (1,) * (x.ndim - 2) + (x.shape[-1],)
        return F.layer_norm(x, x.shape[-1:], eps=1e-6) * weight.reshape(view) + bias.reshape(view)

    def embed(self, images: Tensor) -> Tensor:
        """Images (K, B, C, H, W) -> tokens (K, B, T, D): patches as one batched product, then CLS,
        positions and registers as in ``VisionTransformer.embed``."""
        cfg, K = self.cfg, self.num_models
        if images.ndim != 5 or images.shape[0] != K or tuple(images.shape[2:]) != (cfg.in_chans, cfg.img_size,
                                                                                   cfg.img_size):
            raise ValueError(f"a pack of {K} takes images ({K}, B, {cfg.in_chans}, {cfg.img_size}, {cfg.img_size}), "
                             f"got {tuple(images.shape)}; stack one batch per member at the training size")
        B, p = images.shape[1], cfg.patch_size
        gh, gw = cfg.grid_size
        patches = images.reshape(K, B, cfg.in_chans, gh, p, gw, p).permute(0, 1, 3, 5, 2, 4, 6)
        patches = patches.reshape(K, B, gh * gw, cfg.in_chans * p * p)
        weight = self.param("patch_embed.proj.weight").reshape(K, cfg.embed_dim, -1)
        x = torch.baddbmm(self.param("patch_embed.proj.bias")[:, None, :].to(patches.dtype),
                          patches.reshape(K, B * gh * gw, -1), weight.transpose(1, 2).to(patches.dtype))
        x = x.reshape(K, B, gh * gw, cfg.embed_dim)
        if cfg.class_token:
            x = torch.cat([self.param("cls_token").expand(K, B, 1, -1).to(x.dtype), x], dim=2)
        x = x + self.param("pos_embed").to(x.dtype)
        if cfg.num_registers:
            start = int(cfg.class_token)
            regs = self.param("reg_token").expand(K, B, -1, -1).to(x.dtype)
            x = torch.cat([x[:, :, :start], regs, x[:, :, start:]], dim=2)
        return x

    def _attention(self, x: Tensor, i: int) -> Tensor:
        K, B, T, D = x.shape
        heads = self.cfg.num_heads
        qkv = self._linear(x, f"blocks.{i}.attn.qkv").reshape(K * B, T, 3, heads, D // heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        normalizer = self._normalizers[i]
        if normalizer.is_softmax:
            out = F.scaled_dot_product_attention(q, k, v)
        else:
            out = normalizer(masked_logits(q * (D // heads) ** -0.5, k, None)) @ v
        return self._linear(out.transpose(1, 2).reshape(K, B, T, D), f"blocks.{i}.attn.proj")

    def forward_tokens(self, images: Tensor) -> Tensor:
        """All tokens (K, B, T, D) after the last block, before the final norm."""
        x = self.embed(images)
        for i in range(self.cfg.depth):
            x = x + self._attention(self._layer_norm(x, f"blocks.{i}.norm1"), i)
            hidden = F.gelu(self._linear(self._layer_norm(x, f"blocks.{i}.norm2"), f"blocks.{i}.mlp.fc1"))
            x = x + self._linear(hidden, f"blocks.{i}.mlp.fc2")
        return x

    def forward(self, images: Tensor) -> Tensor:
        """Logits (K, B, num_classes), or pooled features (K, B, D) without a head."""
        x = self._layer_norm(self.forward_tokens(images), "norm")
        pooled = x[:, :, 0] if self.cfg.pool == "cls" else x[:, :, self.cfg.num_prefix_tokens:].mean(dim=2)
        return self._linear(pooled, "head") if self.cfg.num_classes else pooled


class VmappedModels(nn.Module):
    """The ``torch.func`` twin of ``PackedViT``: members' weights stacked by ``stack_module_state`` and the
    solo model's own forward mapped over them with ``vmap``. Same input and output shapes."""

    def __init__(self, models: Sequence[VisionTransformer]):
        super().__init__()
        check_packable(models)
        params, buffers = torch.func.stack_module_state(list(models))
        self.stacked = nn.ParameterDict({_slot(n): nn.Parameter(p) for n, p in params.items()})
        self._names = list(params)
        self._buffers_stacked = buffers
        self._base = [copy.deepcopy(models[0]).to("meta")]  # a list: not a submodule, holds no weights

    def forward(self, images: Tensor) -> Tensor:
        params = {name: self.stacked[_slot(name)] for name in self._names}
        buffers = {name: b.to(images.device) for name, b in self._buffers_stacked.items()}

        def one(p, b, x):
            return torch.func.functional_call(self._base[0], (p, b), (x,))

        return torch.vmap(one)(params, buffers, images)
