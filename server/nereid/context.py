"""ModelContext: what a model's ``__init__`` receives about itself.

Owns the record only; the model manager fills it in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from nereid.custom_metrics import MetricFamily, MetricKind, MetricsSink

__all__ = ["ModelContext"]


@dataclass(frozen=True, slots=True)
class ModelContext:
    """Facts about one model instance, handed to ``Model.__init__(context)``.

    Attributes:
        model_name: the model's folder name, e.g. ``"add_one"``.
        model_version: the version being loaded (1 for the unversioned layout).
        instance_name: ``"<model>_<index>"``, e.g. ``"add_one_0"``; unique per model.
        instance_index: 0-based index of this instance within the model.
        device: ``"cuda:N"`` or ``"cpu"``: where the instance should put its tensors.
        kind: ``"GPU"`` or ``"CPU"``.
        config: the model config in Triton's JSON form (as ``/v2/models/{m}/config``).
        parameters: the config's ``[parameters]`` table, every value a string.
        model_dir: the version folder holding the model file.
        max_batch_size: the config's ``max_batch_size`` (0: the model does not batch).
        metrics: where ``metric_family`` sends its series (None: custom metrics are off).
    """

    model_name: str
    model_version: int
    instance_name: str
    device: str
    kind: str
    config: Mapping[str, Any]
    parameters: Mapping[str, str]
    model_dir: Path
    instance_index: int = 0
    max_batch_size: int = 0
    device_id: int | None = field(default=None)
    metrics: MetricsSink | None = field(default=None, compare=False, repr=False)

    def metric_family(self, name: str, description: str, kind: MetricKind | str = "counter") -> MetricFamily:
        """A custom metric family on the server's ``/metrics`` (Triton's
        ``pb_utils.MetricFamily``): ``kind`` ``"counter"``, ``"gauge"`` or ``"histogram"``;
        ``.metric(labels={...})`` gives a series. It leaves ``/metrics`` when the model
        unloads (or when every object for it is dropped). Raises MetricError (a name
        already used with another kind, a bad name)."""
        from nereid.custom_metrics import MetricError, MetricFamily

        if self.metrics is None:
            raise MetricError(f'model "{self.model_name}": custom metrics are not available here (no server)')
        return MetricFamily(self.metrics, name, description, kind)
