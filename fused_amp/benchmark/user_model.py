"""The parameter list of the user's model, from ``--model``:

* ``MODULE:FACTORY``: ``FACTORY()`` from ``MODULE`` (importable from the current folder or the
  path), returning an ``nn.Module``;
* ``hf:NAME``: a Hugging Face model built from its config (a folder with config.json, or a name
  in the local cache; nothing is downloaded), where transformers is installed.

The model is built on the meta device where it allows, so that only shapes are made; the suite
then allocates the params it times itself."""
import importlib
import os
import sys
from typing import List, NamedTuple

import torch


class ModelParams(NamedTuple):
    name: str
    shapes: List[tuple]  # the trainable params (tied ones once), in the model's order
    dtypes: List[str]


def _build(factory):
    try:
        with torch.device("meta"):
            return factory()
    except Exception:  # a factory that loads or computes on its tensors: build it for real
        return factory()


def _factory(spec: str):
    if spec.startswith("hf:"):
        try:
            import transformers
        except ImportError:
            raise SystemExit(f"--model {spec}: transformers is not installed (pip install transformers)")
        name = spec[3:]
        try:
            config = transformers.AutoConfig.from_pretrained(name, local_files_only=True)
        except OSError as e:
            raise SystemExit(f"--model {spec}: no local config for {name!r} (a folder with config.json, "
                             f"or a model in the Hugging Face cache; nothing is downloaded): {e}")

        def build():
            try:
                return transformers.AutoModelForCausalLM.from_config(config)
            except ValueError:  # not a causal LM: the bare model
                return transformers.AutoModel.from_config(config)
        return build
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise SystemExit(f"--model {spec!r}: expected MODULE:FACTORY (e.g. mypackage.models:build) or hf:NAME")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as python -m does: a module beside the user
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise SystemExit(f"--model {spec}: cannot import {module_name!r}: {e}")
    factory = module
    for part in attr.split("."):
        factory = getattr(factory, part, None)
    if not callable(factory):
        raise SystemExit(f"--model {spec}: {module_name} has no callable {attr!r}")
    return factory


def load(spec: str) -> ModelParams:
    model = _build(_factory(spec))
    if not isinstance(model, torch.nn.Module):
        raise SystemExit(f"--model {spec}: the factory returned {type(model).__name__}, not an nn.Module")
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise SystemExit(f"--model {spec}: the model has no trainable parameters")
    return ModelParams(spec, [tuple(p.shape) for p in params], [str(p.dtype).split(".")[1] for p in params])
