"""The models of the coverage suite (``benchmarks/model_zoo.py``): MONAI's configurations, how each zoo's models
are built with random weights, and the rule that chooses them (every torchvision classification and segmentation
model, the smallest model of each timm family, MONAI's 2-D networks, every segmentation_models_pytorch
architecture as it builds by default; at most ``MAX_PARAMS`` parameters).

Importing it is cheap (the standard library only): the ranks import ``model_zoo.py`` by path to build models by
spec, and it imports this file."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["MAX_PARAMS", "MONAI_NETWORKS", "MONAI_VOLUME_NETWORKS", "VOLUME_SUFFIX", "ZooModel", "first_line",
           "is_volume", "meta_params", "monai_catalogue", "monai_model", "SMP_OPTIONS", "smp_catalogue", "smp_model",
           "spec_of", "HF_MODELS", "hf_catalogue", "hf_model", "DIFFUSERS_MODELS", "diffusers_catalogue",
           "diffusers_model", "output_of", "SCIENCE_MODELS", "science_catalogue", "science_model",
           "takes_timestep", "timm_catalogue", "timm_model", "torchvision_catalogue",
           "torchvision_model"]

MODEL_ZOO = Path(__file__).resolve().with_name("model_zoo.py")
"""The file whose ``__getattr__`` builds ``timm__NAME__SIDE``, ``monai__NAME`` and ``torchvision__NAME``."""
MAX_PARAMS = 100_000_000

MONAI_NETWORKS: dict[str, dict[str, Any]] = {
    "UNet": {"spatial_dims": 2, "in_channels": 3, "out_channels": 2, "channels": (8, 16, 32), "strides": (2, 2),
             "num_res_units": 1},
    "BasicUNet": {"spatial_dims": 2, "in_channels": 3, "out_channels": 2, "features": (8, 8, 16, 32, 64, 8)},
    "BasicUNetPlusPlus": {"spatial_dims": 2, "in_channels": 3, "out_channels": 2, "features": (8, 8, 16, 32, 64, 8)},
    "AttentionUnet": {"spatial_dims": 2, "in_channels": 3, "out_channels": 2, "channels": (8, 16, 32),
                      "strides": (2, 2)},
    "SegResNet": {"spatial_dims": 2, "in_channels": 3, "out_channels": 2, "init_filters": 8},
    "SegResNetDS": {"spatial_dims": 2, "in_channels": 3, "out_channels": 2, "init_filters": 8},
    "DynUNet": {"spatial_dims": 2, "in_channels": 3, "out_channels": 2, "kernel_size": (3, 3, 3),
                "strides": (1, 2, 2), "upsample_kernel_size": (2, 2), "filters": (8, 16, 32)},
    "HighResNet": {"spatial_dims": 2, "in_channels": 3, "out_channels": 2},
    "DenseNet121": {"spatial_dims": 2, "in_channels": 3, "out_channels": 10},
    "UNETR": {"spatial_dims": 2, "in_channels": 3, "out_channels": 2, "img_size": (32, 32), "feature_size": 8,
              "hidden_size": 96, "mlp_dim": 192, "num_heads": 4},
    "SwinUNETR": {"spatial_dims": 2, "in_channels": 3, "out_channels": 2, "feature_size": 12,
                  "depths": (1, 1, 1, 1)},
}
"""MONAI's 2-D networks and the small configuration each is built with."""

MONAI_VOLUME_NETWORKS: dict[str, dict[str, Any]] = {
    "UNet": {"spatial_dims": 3, "in_channels": 1, "out_channels": 2, "channels": (8, 16, 32), "strides": (2, 2),
             "num_res_units": 1},
    "BasicUNet": {"spatial_dims": 3, "in_channels": 1, "out_channels": 2, "features": (8, 8, 16, 32, 64, 8)},
    "AttentionUnet": {"spatial_dims": 3, "in_channels": 1, "out_channels": 2, "channels": (8, 16, 32),
                      "strides": (2, 2)},
    "SegResNet": {"spatial_dims": 3, "in_channels": 1, "out_channels": 2, "init_filters": 8},
    "DynUNet": {"spatial_dims": 3, "in_channels": 1, "out_channels": 2, "kernel_size": (3, 3, 3),
                "strides": (1, 2, 2), "upsample_kernel_size": (2, 2), "filters": (8, 16, 32)},
}
"""MONAI's 3-D networks (one input channel: a medical volume) at the small configuration each is built with;
their zoo entries are named ``NAME 3d`` and take ``N,1,S,S,S`` volumes."""
VOLUME_SUFFIX = " 3d"


@dataclass(frozen=True)
class ZooModel:
    """One model of a zoo: how to build it (``spec``), its size, and why it is skipped (``skip``) if it is."""

    zoo: str
    name: str
    spec: str
    params: int | None
    family: str = ""
    config: str = ""
    skip: str = ""


def torchvision_model(name: str) -> Any:
    """torchvision's ``name`` with random weights, a segmentation model's backbone too (``torchvision:NAME``
    would download the backbone's ImageNet weights)."""
    from torchvision import models

    return models.get_model(name, weights=None, weights_backbone=None)


def timm_model(name: str, side: int = 0) -> Any:
    """timm's ``name`` with random weights, built for ``side``×``side`` inputs when ``side`` (``img_size``)."""
    import timm

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return timm.create_model(name, pretrained=False, **({"img_size": side} if side else {}))


def monai_model(name: str) -> Any:
    """MONAI's network ``name`` in its ``MONAI_NETWORKS`` configuration (``NAME 3d``: ``MONAI_VOLUME_NETWORKS``)."""
    from monai.networks import nets

    volume = name.endswith(VOLUME_SUFFIX)
    base = name[:-len(VOLUME_SUFFIX)] if volume else name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(nets, base)(**(MONAI_VOLUME_NETWORKS if volume else MONAI_NETWORKS)[base])


SMP_OPTIONS: dict[str, Any] = {"encoder_weights": None, "classes": 2}
"""What segmentation_models_pytorch's architectures are built with besides their defaults: no download, and two
classes (its default, one, makes a cross-entropy loss constant: every gradient zero, a check that cannot fail)."""


def smp_model(name: str) -> Any:
    """segmentation_models_pytorch's architecture ``name`` (``smp.create_model``'s name) with its own defaults
    (encoder included) and ``SMP_OPTIONS``."""
    import segmentation_models_pytorch as smp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return smp.MODEL_ARCHITECTURES_MAPPING[name](**SMP_OPTIONS)


HF_MODELS: tuple[str, ...] = ("ConvNext", "ConvNextV2", "Dinov2", "MobileViT", "ResNet", "Segformer", "Swin", "ViT")
"""Hugging Face transformers' vision models, each ``<NAME>Config()`` (the library's default configuration) with
``HF_OPTIONS`` and its ``<NAME>ForImageClassification`` head (Segformer: ``ForSemanticSegmentation``)."""
HF_OPTIONS: dict[str, Any] = {"num_labels": 2}
"""What the transformers models are built with besides their defaults (two classes: see ``SMP_OPTIONS``)."""
_HF_HEADS = {"Segformer": "ForSemanticSegmentation"}

DIFFUSERS_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "UNet2DModel": ("UNet2DModel", {"block_out_channels": (32, 64, 64, 64), "norm_num_groups": 8,
                                    "layers_per_block": 1}),
    "AutoencoderKL": ("AutoencoderKL", {}),
    "AutoencoderKL 3 levels": ("AutoencoderKL", {"down_block_types": ("DownEncoderBlock2D",) * 3,
                                                 "up_block_types": ("UpDecoderBlock2D",) * 3,
                                                 "block_out_channels": (32, 64, 64), "norm_num_groups": 8}),
    "VQModel": ("VQModel", {}),
}
"""diffusers' image models: the class and what it is built with besides its defaults — ``UNet2DModel`` narrower
(its default widths make 274 M parameters; its block types, attention included, kept), ``AutoencoderKL`` and
``VQModel`` as they build by default, and an ``AutoencoderKL`` with three levels (its downsampling pads one side).
``UNet2DModel`` takes the timestep as a second input (one per sample)."""


SCIENCE_MODELS: dict[str, dict[str, tuple[str, dict[str, Any]]]] = {
    "neuralop": {
        "FNO": ("neuralop.models:FNO", {"n_modes": (8, 8), "in_channels": 3, "out_channels": 2,
                                        "hidden_channels": 16}),
        "TFNO": ("neuralop.models:TFNO", {"n_modes": (8, 8), "in_channels": 3, "out_channels": 2,
                                          "hidden_channels": 16}),
    },
    "physicsnemo": {
        "FNO": ("physicsnemo.models.fno:FNO", {"in_channels": 3, "out_channels": 2, "latent_channels": 16,
                                               "num_fno_layers": 2, "num_fno_modes": 8}),
        "AFNO": ("physicsnemo.models.afno:AFNO", {"inp_shape": [32, 32], "in_channels": 3, "out_channels": 2,
                                                  "patch_size": [4, 4], "embed_dim": 64, "depth": 2}),
        "Pix2Pix": ("physicsnemo.models.pix2pix:Pix2Pix", {"in_channels": 3, "out_channels": 2, "dimension": 2,
                                                           "conv_layer_size": 16, "n_downsampling": 2,
                                                           "n_upsampling": 2, "n_blocks": 2}),
    },
}
"""Scientific-ML libraries' 2-D models (neuraloperator, NVIDIA physicsnemo): the class and the small
configuration each is built with (their constructors have no default sizes); the zoos ``neuralop`` and
``physicsnemo``. AFNO is built for 32×32 inputs (its patch grid is fixed at construction)."""


def science_model(zoo: str, name: str) -> Any:
    """``SCIENCE_MODELS[zoo][name]`` with random weights."""
    import importlib

    path, options = SCIENCE_MODELS[zoo][name]
    module, _, cls = path.partition(":")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(importlib.import_module(module), cls)(**options)


def science_catalogue(zoo: str) -> list[ZooModel]:
    """``SCIENCE_MODELS[zoo]``, each with what it is built with."""
    from importlib.metadata import version

    package = {"neuralop": "neuraloperator", "physicsnemo": "nvidia-physicsnemo"}[zoo]
    found = []
    for name, (path, options) in SCIENCE_MODELS[zoo].items():
        text = ", ".join(f"{key}={value}" for key, value in options.items())
        found.append(_counted(zoo, name, lambda name=name: science_model(zoo, name), spec_of(f"{zoo}__{name}"),
                              f"{path.rpartition(':')[2]}({text}); {package} {version(package)}"))
    return found


def hf_model(name: str) -> Any:
    """transformers' ``HF_MODELS`` entry ``name`` with random weights."""
    import transformers

    config = getattr(transformers, f"{name}Config")(**HF_OPTIONS)
    return getattr(transformers, f"{name}{_HF_HEADS.get(name, 'ForImageClassification')}")(config)


def diffusers_model(name: str) -> Any:
    """diffusers' ``DIFFUSERS_MODELS`` entry ``name`` with random weights."""
    import diffusers

    cls, options = DIFFUSERS_MODELS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(diffusers, cls)(**options)


def output_of(entry: ZooModel) -> str | None:
    """The part of the entry's output its loss is taken of (``--output``): diffusers' ``sample`` (a ``VQModel``
    also returns its commitment loss, a scalar no target fits); ``None``: all of it."""
    return "sample" if entry.zoo == "diffusers" else None


def takes_timestep(entry: ZooModel) -> bool:
    """Whether the zoo entry's forward takes a timestep per sample after the image (diffusers' UNet)."""
    return entry.zoo == "diffusers" and DIFFUSERS_MODELS[entry.name][0] == "UNet2DModel"


def is_volume(entry: ZooModel) -> bool:
    """Whether the zoo entry is a 3-D network (its input is a volume)."""
    return entry.zoo == "monai" and entry.name.endswith(VOLUME_SUFFIX)


def spec_of(factory: str) -> str:
    """The MODEL spec of one of this file's factories (an absolute path: ranks import the file by it)."""
    return f"{MODEL_ZOO}:{factory}"


# ----------------------------------------------------------------------------------------------- catalogue
def meta_params(build: Callable[[], Any]) -> int:
    """Parameters of the model ``build`` makes, built on the meta device (no memory, no initialisation cost).

    A builder that computes with tensors (RegNet's widths) cannot run on meta; it runs on the CPU with each
    parameter moved to meta as it is registered, so the weights are never held or initialised together.
    """
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with torch.device("meta"):
                model = build()
        except (NotImplementedError, RuntimeError):
            with _parameters_on_meta():
                model = build()
    return sum(p.numel() for p in model.parameters())


@contextmanager
def _parameters_on_meta() -> Iterator[None]:
    from torch import nn

    original = nn.Module.register_parameter

    def register(module: Any, name: str, param: Any) -> None:
        if param is not None:
            param = nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
        original(module, name, param)

    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def torchvision_catalogue() -> list[ZooModel]:
    import torchvision
    from torchvision import models

    classification = sorted(models.list_models(module=models))
    names = classification + sorted(models.list_models(module=models.segmentation))
    found = []
    for name in names:
        spec = f"torchvision:{name}" if name in classification else spec_of(f"torchvision__{name}")
        try:
            params = meta_params(lambda name=name: torchvision_model(name) if name not in classification
                                 else models.get_model(name, weights=None))
        except Exception as err:
            found.append(ZooModel("torchvision", name, spec, None,
                                  skip=f"does not build: {type(err).__name__}: {first_line(err)}"))
            continue
        found.append(ZooModel("torchvision", name, spec, params, skip=_too_large(params),
                              config=f"torchvision {torchvision.__version__}"))
    return found


def timm_catalogue(progress: Callable[[str], None] = print) -> list[ZooModel]:
    """Per family the smallest model; counting all of ``timm.list_models()`` takes minutes (cached in --out)."""
    import timm
    from timm.models import model_entrypoint

    families: dict[str, list[tuple[int, str]]] = {}
    names = timm.list_models()
    for index, name in enumerate(names):
        if index % 200 == 0:
            progress(f"counting timm parameters on the meta device: {index}/{len(names)}")
        family = model_entrypoint(name).__module__.rsplit(".", 1)[-1]
        try:
            families.setdefault(family, []).append((meta_params(lambda name=name: timm_model(name)), name))
        except Exception as err:  # a model that does not build on meta: counted as not buildable
            families.setdefault(family, []).append((-1, f"{name}\0{type(err).__name__}: {err}"))
    chosen = []
    for family, members in sorted(families.items()):
        built = sorted(m for m in members if m[0] >= 0)
        if not built:
            name, _, error = members[0][1].partition("\0")
            chosen.append(ZooModel("timm", name, "", None, family, skip=f"does not build: {error[:120]}"))
            continue
        params, name = built[0]
        chosen.append(ZooModel("timm", name, "", params, family, skip=_too_large(params),
                               config=f"smallest of {len(members)} in timm.models.{family}"))
    return chosen


def monai_catalogue() -> list[ZooModel]:
    found = []
    networks = [*MONAI_NETWORKS.items(), *((name + VOLUME_SUFFIX, config) for name, config in
                                           MONAI_VOLUME_NETWORKS.items())]
    for name, config in networks:
        text = ", ".join(f"{key}={value}" for key, value in config.items())
        factory = f"monai__{name.replace(VOLUME_SUFFIX, '__3d')}"
        found.append(_counted("monai", name, lambda name=name: monai_model(name), spec_of(factory), text))
    return found


def smp_catalogue() -> list[ZooModel]:
    """Every architecture of segmentation_models_pytorch, as it builds by default (``smp_model``)."""
    import segmentation_models_pytorch as smp

    config = ", ".join(f"{key}={value}" for key, value in SMP_OPTIONS.items())
    return [_counted("smp", name, lambda name=name: smp_model(name), spec_of(f"smp__{name}"),
                     f"{config}; segmentation_models_pytorch {smp.__version__}")
            for name in sorted(smp.MODEL_ARCHITECTURES_MAPPING)]


def hf_catalogue() -> list[ZooModel]:
    """``HF_MODELS`` at transformers' default configurations."""
    import transformers

    config = ", ".join(f"{key}={value}" for key, value in HF_OPTIONS.items())
    return [_counted("hf", name, lambda name=name: hf_model(name), spec_of(f"hf__{name}"),
                     f"{config}; transformers {transformers.__version__}") for name in HF_MODELS]


def diffusers_catalogue() -> list[ZooModel]:
    """``DIFFUSERS_MODELS``, each with what it is built with."""
    import diffusers

    found = []
    for name, (cls, options) in DIFFUSERS_MODELS.items():
        text = ", ".join(f"{key}={value}" for key, value in options.items()) or "defaults"
        factory = "diffusers__" + name.replace(" ", "_")
        found.append(_counted("diffusers", name, lambda name=name: diffusers_model(name), spec_of(factory),
                              f"{cls}({text}); diffusers {diffusers.__version__}"))
    return found


def _counted(zoo: str, name: str, build: Callable[[], Any], spec: str, config: str) -> ZooModel:
    """The entry of a model ``build`` makes, its parameters counted on the meta device (built for real where the
    meta device fails); skipped, with why, when it does not build or is larger than ``MAX_PARAMS``."""
    try:
        params = meta_params(build)
    except Exception:  # some constructors fill tensors in ways the meta device refuses: counted on a real build
        try:
            params = sum(p.numel() for p in build().parameters())
        except Exception as err:
            return ZooModel(zoo, name, "", None, config=config,
                            skip=f"does not build: {type(err).__name__}: {first_line(err)}")
    return ZooModel(zoo, name, spec, params, config=config, skip=_too_large(params))


def _too_large(params: int) -> str:
    return f"{params / 1e6:.1f} M parameters > {MAX_PARAMS / 1e6:.0f} M" if params > MAX_PARAMS else ""


def first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__
