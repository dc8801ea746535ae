"""Loading user models through one small interface: ``load_model(source)`` then
``predict(batch)``. Torch is imported only when a torch or zoo network is loaded."""

from __future__ import annotations

from parityserve.models.base import LoadedModel, Model
from parityserve.models.loader import SCHEMES, load_model
from parityserve.models.zoo import ZOO_NAMES

__all__ = ["SCHEMES", "ZOO_NAMES", "LoadedModel", "Model", "load_model"]
