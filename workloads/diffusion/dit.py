"""DiT: a class-conditional diffusion transformer over VAE latents (Peebles & Xie, 2023).

A latent (4 channels, a 256 px image's is 32 x 32) is cut into p x p patches, each a token;
every block is a ViT block whose LayerNorms are modulated, and whose two branches are
gated, by a vector from the timestep and the class label (adaLN-Zero). The model predicts
the noise ε and, as in the paper's "learned sigma" setting, a variance per channel: its
output has 8 channels, and the published 675,129,632 parameters of XL/2 include them.
Module and parameter names are those of facebookresearch/DiT's ``models.py``, so its
checkpoints' state dicts have exactly this model's keys and shapes.

Training is the paper's L_simple: a timestep t uniform in [0, 1000), Gaussian noise ε,
the latent noised to ``sqrt(ᾱ_t) x + sqrt(1 - ᾱ_t) ε`` on the linear β schedule
(1e-4 to 0.02), and the MSE between ε and the first 4 output channels. The variance
channels are computed and counted but not trained (the paper's L_vlb term, which would
train them, is left out). Labels are replaced by the null class with probability 0.1 when
the batch is drawn (classifier-free guidance's label dropout), so the step itself draws
nothing random.

Weights are random everywhere: DiT's zero initialisation of the adaLN and output layers
would make every output exactly 0 and any comparison of outputs vacuous.

The fixed sin-cos position table is a frozen parameter (as in ``models.py``) for the
32 x 32 latent of a 256 px image; a smaller latent uses its top-left corner, which is
exactly the table a smaller grid would have.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from workloads.attention import scores_bytes, sdpa
from workloads.base import MODES, Batch, ParallelPlan, Published, Shape, Workload

TIMESTEPS = 1000
FREQUENCY_DIM = 256  # the sinusoidal timestep embedding's width
LATENT_CHANNELS = 4


@dataclass(frozen=True)
class DiTConfig:
    depth: int
    hidden: int
    patch: int
    heads: int
    mlp_ratio: int = 4
    num_classes: int = 1000
    max_latent: int = 32  # the position table's grid, in latent pixels per side
    learn_sigma: bool = True
    class_dropout: float = 0.1

    @property
    def out_channels(self) -> int:
        return 2 * LATENT_CHANNELS if self.learn_sigma else LATENT_CHANNELS

    def tokens(self, latent_size: int) -> int:
        return (latent_size // self.patch) ** 2


SIZES = {
    "tiny": DiTConfig(depth=2, hidden=64, patch=2, heads=4, num_classes=10),
    "s2": DiTConfig(depth=12, hidden=384, patch=2, heads=6),
    "b2": DiTConfig(depth=12, hidden=768, patch=2, heads=12),
    "xl2": DiTConfig(depth=28, hidden=1152, patch=2, heads=16),
}

PUBLISHED = {
    "xl2": Published(
        params=675_129_632,
        source="Peebles & Xie 2023 (DiT-XL/2: 675M); facebookresearch/DiT models.py DiT_XL_2 layer shapes, "
        "including the frozen 294,912-element pos_embed (675,129,632)",
    ),
}


def sincos_table(hidden: int, grid: int) -> torch.Tensor:
    """DiT's 2-D sin-cos position table (grid*grid, hidden), rows of patches in order: the first half
    of the width encodes a patch's column, the second its row (``get_2d_sincos_pos_embed``)."""
    omega = 1.0 / 10000 ** (torch.arange(hidden // 4, dtype=torch.float64) / (hidden / 4))
    coordinate = torch.arange(grid, dtype=torch.float64)
    rows, columns = coordinate.repeat_interleave(grid), coordinate.repeat(grid)

    def encode(positions: torch.Tensor) -> torch.Tensor:
        angles = torch.outer(positions, omega)
        return torch.cat([angles.sin(), angles.cos()], dim=1)

    return torch.cat([encode(columns), encode(rows)], dim=1)


def timestep_embedding(t: torch.Tensor, dim: int = FREQUENCY_DIM, max_period: int = 10000) -> torch.Tensor:
    """Sinusoidal embedding of (B,) timesteps, in float32."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    angles = t.float()[:, None] * freqs[None]
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class PatchEmbed(nn.Module):
    def __init__(self, config: DiTConfig):
        super().__init__()
        self.proj = nn.Conv2d(LATENT_CHANNELS, config.hidden, config.patch, stride=config.patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # (B, T, D), rows of patches in order


class TimestepEmbedder(nn.Module):
    def __init__(self, config: DiTConfig):
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(FREQUENCY_DIM, config.hidden), nn.SiLU(), nn.Linear(config.hidden, config.hidden)
        )

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.mlp(timestep_embedding(t).to(self.mlp[0].weight.dtype))


class LabelEmbedder(nn.Module):
    def __init__(self, config: DiTConfig):
        super().__init__()
        null_class = config.class_dropout > 0  # the extra row classifier-free guidance drops labels to
        self.embedding_table = nn.Embedding(config.num_classes + null_class, config.hidden)

    def forward(self, labels: torch.Tensor) -> torch.Tensor:
        return self.embedding_table(labels)


class Attention(nn.Module):
    def __init__(self, config: DiTConfig):
        super().__init__()
        self.heads = config.heads
        self.qkv = nn.Linear(config.hidden, 3 * config.hidden)
        self.proj = nn.Linear(config.hidden, config.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = x.shape
        qkv = self.qkv(x).view(batch, tokens, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        attended = sdpa(qkv[0], qkv[1], qkv[2])  # bidirectional, by the run's kernel
        return self.proj(attended.transpose(1, 2).reshape(batch, tokens, dim))


class Mlp(nn.Module):
    def __init__(self, config: DiTConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.hidden, config.mlp_ratio * config.hidden)
        self.fc2 = nn.Linear(config.mlp_ratio * config.hidden, config.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class DiTBlock(nn.Module):
    """A ViT block with adaLN-Zero: shift, scale and gate for both branches come from ``c``."""

    def __init__(self, config: DiTConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.hidden, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(config)
        self.norm2 = nn.LayerNorm(config.hidden, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(config)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(config.hidden, 6 * config.hidden))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c).chunk(6, dim=1)
        x = x + gate_msa.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_msa, scale_msa))
        return x + gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))


class FinalLayer(nn.Module):
    def __init__(self, config: DiTConfig):
        super().__init__()
        self.norm_final = nn.LayerNorm(config.hidden, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(config.hidden, config.patch**2 * config.out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(config.hidden, 2 * config.hidden))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class DiT(nn.Module):
    def __init__(self, config: DiTConfig):
        super().__init__()
        self.config = config
        self.x_embedder = PatchEmbed(config)
        self.t_embedder = TimestepEmbedder(config)
        self.y_embedder = LabelEmbedder(config)
        grid = config.max_latent // config.patch
        self.pos_embed = nn.Parameter(torch.empty(1, grid * grid, config.hidden), requires_grad=False)
        self.blocks = nn.ModuleList(DiTBlock(config) for _ in range(config.depth))
        self.final_layer = FinalLayer(config)
        self.apply(init_weights)
        with torch.no_grad():
            self.pos_embed.copy_(sincos_table(config.hidden, grid).unsqueeze(0))

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The (B, out_channels, H, W) prediction for latents ``x`` at timesteps ``t`` of classes ``y``."""
        config = self.config
        grid = x.shape[-1] // config.patch
        table = self.pos_embed.view(config.max_latent // config.patch, -1, config.hidden)[:grid, :grid]
        tokens = self.x_embedder(x.to(self.pos_embed.dtype)) + table.reshape(1, grid * grid, config.hidden)
        c = self.t_embedder(t) + self.y_embedder(y)
        for block in self.blocks:
            tokens = block(tokens, c)
        patches = self.final_layer(tokens, c)  # (B, T, p*p*out)
        batch, p = x.shape[0], config.patch
        patches = patches.view(batch, grid, grid, p, p, config.out_channels).permute(0, 5, 1, 3, 2, 4)
        return patches.reshape(batch, config.out_channels, grid * p, grid * p)


def init_weights(module: nn.Module) -> None:
    """DiT's Xavier-uniform linears and N(0, 0.02) label table, without its zero-initialised layers."""
    if isinstance(module, (nn.Linear, nn.Conv2d)):
        nn.init.xavier_uniform_(module.weight.view(module.weight.shape[0], -1))
        nn.init.zeros_(module.bias)
    if isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=0.02)


def alphas_cumprod() -> torch.Tensor:
    """ᾱ_t of DiT's linear β schedule, 1e-4 to 0.02 over 1000 steps (float64, as its diffusion code)."""
    betas = torch.linspace(1e-4, 0.02, TIMESTEPS, dtype=torch.float64)
    return torch.cumprod(1 - betas, dim=0)


def make_batch(config: DiTConfig, shape: Shape, generator: torch.Generator) -> Batch:
    """Latents, noise, a timestep per sample with its ᾱ_t, and labels (10% dropped to the null class)."""
    size = shape.latent_size
    if size > config.max_latent or size % config.patch:
        raise ValueError(
            f"latent_size {size} must be a multiple of the patch ({config.patch}) "
            f"and at most {config.max_latent}, the position table's grid"
        )
    batch = shape.batch_size
    timesteps = torch.randint(0, TIMESTEPS, (batch,), generator=generator)
    labels = torch.randint(0, config.num_classes, (batch,), generator=generator)
    dropped = torch.rand(batch, generator=generator) < config.class_dropout
    return {
        "latents": torch.randn(batch, LATENT_CHANNELS, size, size, generator=generator),
        "noise": torch.randn(batch, LATENT_CHANNELS, size, size, generator=generator),
        "timesteps": timesteps,
        "alpha_bar": alphas_cumprod()[timesteps].float(),
        "labels": torch.where(dropped, config.num_classes, labels),
    }


def loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """L_simple: MSE between the noise and the prediction's ε channels at the noised latent."""
    alpha_bar = batch["alpha_bar"].view(-1, 1, 1, 1)
    noised = alpha_bar.sqrt() * batch["latents"] + (1 - alpha_bar).sqrt() * batch["noise"]
    prediction = model(noised, batch["timesteps"], batch["labels"])
    return F.mse_loss(prediction[:, :LATENT_CHANNELS].float(), batch["noise"])


def forward(model: nn.Module, batch: Batch) -> torch.Tensor:
    """One denoising call: the prediction for the batch's latents at its timesteps."""
    return model(batch["latents"], batch["timesteps"], batch["labels"])


def flops(config: DiTConfig, shape: Shape, mode: str) -> float:
    """One step's matmul and convolution FLOPs, 2 per multiply-add; training is 3x the forward.

    Per sample: the patch convolution, the timestep MLP, and per block the adaLN projection
    (once per sample, not per token), QKV, attention over all T x T pairs, the output
    projection and the MLP; then the final adaLN and linear. Backward costs twice the
    forward, less the input gradients of the patch convolution and the timestep MLP's first
    layer, whose inputs (latents, sinusoids) need none.
    """
    d, tokens = config.hidden, config.tokens(shape.latent_size)
    block = 2 * d * 6 * d + 2 * tokens * (4 * d * d + 2 * config.mlp_ratio * d * d) + 4 * tokens * tokens * d
    no_input_gradient = 2 * tokens * LATENT_CHANNELS * config.patch**2 * d + 2 * FREQUENCY_DIM * d
    outside = no_input_gradient + 2 * d * d + 2 * d * 2 * d  # patch embedding, timestep MLP, final adaLN
    outside += 2 * tokens * d * config.patch**2 * config.out_channels  # final linear
    forward_flops = shape.batch_size * (config.depth * block + outside)
    if mode == "train":
        return float(3 * forward_flops - shape.batch_size * no_input_gradient)
    return float(forward_flops)


def parameter_count(config: DiTConfig) -> int:
    """Every parameter of the model, the frozen position table included."""
    d, p, hidden_mlp = config.hidden, config.patch, config.mlp_ratio * config.hidden
    block = 3 * d * d + 3 * d + d * d + d + 2 * d * hidden_mlp + hidden_mlp + d + 6 * d * d + 6 * d
    embedders = LATENT_CHANNELS * p * p * d + d + FREQUENCY_DIM * d + d + d * d + d
    embedders += (config.num_classes + (config.class_dropout > 0)) * d + (config.max_latent // p) ** 2 * d
    final = d * p * p * config.out_channels + p * p * config.out_channels + 2 * d * d + 2 * d
    return config.depth * block + embedders + final


#: what the estimate does not itemise: normalisation and modulation temporaries, the allocator's slack
ALLOCATOR_HEADROOM = 1.25


def estimate_memory_bytes(config: DiTConfig, shape: Shape, mode: str, dtype: torch.dtype) -> int:
    """The tensors a run holds at its peak (``Workload.memory_bytes`` adds the runtime's
    allowance), used to refuse runs that cannot fit.

    Training keeps weights, gradients and two AdamW moments, and every block's activations:
    per token about 24 d values (QKV, norms, modulated inputs, the two gated branches) and
    the MLP's 2 x mlp_ratio x d, plus the T x T scores and probabilities per head where the
    kernel holds them (a log-sum-exp where it is fused: :func:`workloads.attention.scores_bytes`).
    Inference keeps the weights and one block's activations.
    """
    element = torch.finfo(dtype).bits // 8
    tokens = config.tokens(shape.latent_size)
    per_token = (24 + 2 * config.mlp_ratio) * config.hidden
    scores = scores_bytes(shape.batch_size, config.heads, tokens, tokens, element, copies=2)
    block = shape.batch_size * tokens * per_token * element + scores
    weights = parameter_count(config) * element
    latents = 4 * shape.batch_size * LATENT_CHANNELS * shape.latent_size**2 * 4  # latents, noise, noised, output
    if mode == "train":
        return int((4 * weights + config.depth * block + latents) * ALLOCATOR_HEADROOM)
    return int((weights + block + latents) * ALLOCATOR_HEADROOM)


WORKLOAD = Workload(
    parallel=ParallelPlan(fsdp_units=("blocks.*",)),  # FSDP units; no tensor-parallel plan
    name="dit",
    suites=("diffusion",),
    family="dit",
    description="DiT class-conditional diffusion transformer (adaLN-Zero, learned sigma), ε-prediction",
    sizes=SIZES,
    default_size="tiny",
    default_shape={
        "cpu": Shape(batch_size=4, latent_size=8),
        "cuda": Shape(batch_size=32, latent_size=32),
        "tpu": Shape(batch_size=32, latent_size=32),
    },
    build_model=DiT,
    make_batch=make_batch,
    loss=loss,
    forward=forward,
    flops=flops,
    estimate_memory_bytes=estimate_memory_bytes,
    dims=("latent_size",),
    modes=MODES,
    published=PUBLISHED,
)
