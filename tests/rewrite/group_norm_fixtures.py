"""The diffusers GroupNorm fixtures of tests/rewrite/test_group_norm.py (tests/data/group_norm/), so that CI, which has
no
diffusers, still runs the GroupNorm rewrite on diffusers' own blocks. Regenerate (diffusers installed) with

    python tests/rewrite/group_norm_fixtures.py

Tiny sizes and random weights, from the blocks' constructors: a ResnetBlock2D (GroupNorm + SiLU, twice) and a VAE
decoder's UpDecoderBlock2D (two resnets and the upsampler: four GroupNorms + SiLU), each through TorchScript
(opset 17) and dynamo. `manifest.json` records the versions, the input shape and the GroupNorm count.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from repo_paths import DATA

FOLDER = DATA / "group_norm"
CHANNELS, GROUPS = 16, 4
SHAPE = [2, CHANNELS, 4, 4]


def blocks() -> dict[str, tuple[Any, int]]:
    """name -> (module, GroupNorms in it), weights and norm affines random."""
    import torch
    from diffusers.models.resnet import ResnetBlock2D
    from diffusers.models.unets.unet_2d_blocks import UpDecoderBlock2D

    class Resnet(torch.nn.Module):  # forward(x): no time embedding, as in a VAE
        def __init__(self) -> None:
            super().__init__()
            self.block = ResnetBlock2D(in_channels=CHANNELS, out_channels=CHANNELS, temb_channels=None, groups=GROUPS)

        def forward(self, x: Any) -> Any:
            return self.block(x, None)

    torch.manual_seed(0)
    up = UpDecoderBlock2D(CHANNELS, CHANNELS, num_layers=2, resnet_groups=GROUPS, add_upsample=True)
    found = {"resnet-block-2d": (Resnet(), 2), "vae-up-decoder-block-2d": (up, 4)}
    with torch.no_grad():
        for module, _ in found.values():
            for m in module.modules():
                if isinstance(m, torch.nn.GroupNorm):
                    m.weight.normal_(1.0, 0.3)
                    m.bias.normal_(0.0, 0.3)
    return found


def export(module: Any, path: Path, dynamo: bool) -> None:
    import onnx
    import torch

    kwargs = {"dynamo": True} if dynamo else {"dynamo": False, "opset_version": 17}
    with torch.no_grad():
        torch.onnx.export(module.eval(), (torch.randn(*SHAPE),), str(path), **kwargs)
    # One file each: dynamo writes its weights beside the model.
    model = onnx.load(str(path))
    onnx.save(model, str(path), save_as_external_data=False)
    Path(f"{path}.data").unlink(missing_ok=True)


def main() -> None:
    import diffusers
    import torch

    FOLDER.mkdir(parents=True, exist_ok=True)
    entries = []
    for name, (module, norms) in blocks().items():
        for exporter in ("torchscript", "dynamo"):
            file = f"diffusers-{name}-{exporter}.onnx"
            export(module, FOLDER / file, exporter == "dynamo")
            versions = f"diffusers {diffusers.__version__}, torch {torch.__version__}"
            entries.append({"file": file, "group_norms": norms, "shape": SHAPE, "versions": versions})
    (FOLDER / "manifest.json").write_text(json.dumps(entries, indent=1) + "\n")


if __name__ == "__main__":
    main()
