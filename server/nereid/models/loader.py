"""Loading and closing one model version: import, instances, warmup, labels, batcher.

``ModelLoader.load`` turns a version folder into a ServingModel not yet taking traffic;
``close`` drains and closes one. The model manager decides when (manager.py);
tests give it a stub ``Loader`` instead. User code never runs on the event loop here
(imports and ``__init__`` run in threads).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import operator
import time
from pathlib import Path
from typing import Callable, Protocol, Sequence

from nereid.tensors.assembly import request_cost, signature_function
from nereid.tensors.device import DispatchTurns
from nereid.scheduling.batcher import DynamicBatcher, Instance
from nereid.scheduling.sequence_batcher import SequenceBatcher
from nereid.scheduling.sequence_tensors import SequenceTensors, execution_config
from nereid.config import to_triton_json
from nereid.config.schema import InstanceGroup, ModelConfig, ModelTransactionPolicy
from nereid.context import ModelContext
from nereid.ensembles import EnsembleScheduler, StepModels, decoupled_problem, ensemble_problem
from nereid.custom_metrics import CustomMetrics, OwnedMetrics
from nereid.instances.devices import GpuInventory, isolation_of, placements, process_hosts, resolve_instance_groups
from nereid.errors import InvalidInputError, ModelLoadError, NereidError
from nereid.inference import InferRequest
from nereid.instances.thread import ModelInstance
from nereid.faults import FaultLog
from nereid.repository.model_file import ModelClass, describe_exception, load_model_class, unload_model_module
from nereid.instances.process import ProcessInstance, worker_process
from nereid.instances.supervisor import WorkerProcess
from nereid.repository.scan import ModelSource, VersionSource
from nereid.models.serving import ServingModel
from nereid.stats import ModelStats
from nereid.triton_python.bls import BlsTarget
from nereid.models.warmup import build_samples, run_warmup

__all__ = ["Loader", "ModelLoader", "batcher_for"]

_log = logging.getLogger("nereid")


class Loader(Protocol):
    """What the model manager needs to bring a version up and down."""

    async def load(self, source: ModelSource, version: VersionSource, /) -> ServingModel:
        """A ready ServingModel not yet taking traffic; raises ModelLoadError with the
        reason. On failure or cancellation whatever was started is closed again."""

    async def close(self, serving: ServingModel, /) -> None:
        """Retire ``serving``: let accepted requests finish, then free everything it holds."""


class ModelLoader:
    """The real Loader: model files from the repository, instances on their devices."""

    def __init__(
        self, bls: BlsTarget | None = None, steps: StepModels | None = None, custom_metrics: CustomMetrics | None = None
    ) -> None:
        """``bls``: where its Triton models' BLS requests go (None: BLS not available);
        ``steps``: where its ensembles find their steps' models (None: no ensembles);
        ``custom_metrics``: where its models' metric families go (None: a registry of its own)."""
        self.bls = bls
        self.steps = steps
        self.custom_metrics = custom_metrics if custom_metrics is not None else CustomMetrics()
        self._gpus = GpuInventory()
        #: this server's log of model-code failures (each traceback once, repeats counted)
        self.faults = FaultLog()
        # Model constructors run one at a time (each on its instance's own thread): user
        # __init__ code imports libraries, and some (transformers' lazy modules) are not
        # safe to import from two threads at once. Loading stays off the event loop.
        self._construct_lock = asyncio.Lock()
        #: at shutdown: when (time.monotonic) unloading stops waiting for model code
        self.deadline: float | None = None
        #: "name:version" of the versions whose running batches were abandoned at the deadline
        self.abandoned: list[str] = []

    async def load(self, source: ModelSource, version: VersionSource) -> ServingModel:
        """Import, start every instance, warm up, start the batcher: a ServingModel not yet
        taking traffic. Raises ModelLoadError with the reason (naming file and key); on
        any failure or cancellation whatever was started is closed again."""
        assert source.config is not None
        if source.config.ensemble_scheduling is not None:
            return self._load_ensemble(source, version)
        name = source.name
        instances: list[ModelInstance | ProcessInstance] = []
        model_class: ModelClass | None = None
        try:
            config = await resolve_instance_groups(source.config, source.path / "config.toml", self._gpus)
            config_json = to_triton_json(config)
            samples = await asyncio.to_thread(
                build_samples, config, source.path, model_version=version.version
            )
            groups = placements(config)
            if any(isolation_of(group) == "thread" for group, _ in groups):
                # a process instance imports model.py in its own process, never here
                model_class = await asyncio.to_thread(
                    load_model_class, version.model_file, name, version.version, self.faults
                )
            # every instance first (listed, so that a failed start closes them all), then
            # started in order: instances sharing a process join it before it starts
            self._add_instances(instances, name, config, config_json, version, groups, model_class)
            for instance in instances:
                await self._start_instance(instance)
            if model_class is None:  # process instances only: what they learnt of the class
                model_class = instances[0].model_class
            assert model_class is not None
            tensors = None
            if config.sequence_batching is not None:
                tensors = await asyncio.to_thread(SequenceTensors, config, source.path)
                samples = [dataclasses.replace(sample, request=tensors.warmup(sample.request)) for sample in samples]
            await run_warmup(samples, instances, name)
            labels = await asyncio.to_thread(_load_labels, config, version.path, source.path)
            stats = ModelStats(name, version.version)
            batcher: DynamicBatcher | SequenceBatcher
            if tensors is not None:
                batcher = SequenceBatcher(config=config, tensors=tensors, instances=instances, stats=stats)
            else:
                batcher = batcher_for(name, config, instances, stats)
            await batcher.__aenter__()
        except BaseException as exc:
            await self._undo(name, version, instances, model_class)
            error = _load_error(exc, name, version)
            if error is exc:
                raise
            raise error from exc
        return ServingModel(
            name, version.version, config, config_json, stats, batcher, tuple(instances), model_class, labels
        )

    def _add_instances(
        self, instances: list[ModelInstance | ProcessInstance], name: str, config: ModelConfig,
        config_json: dict[str, object], version: VersionSource, groups: list[tuple[InstanceGroup, str]],
        model_class: ModelClass | None,
    ) -> None:
        """The version's instances, one per placement in ``groups``, added to ``instances``
        unstarted: thread instances of ``model_class``, process instances in the worker
        processes ``process_hosts`` shares them out to."""
        # a sequence model's instances also take its control and state tensors
        run_config = execution_config(config)
        workers: dict[int, WorkerProcess] = {}  # by process_hosts' number
        turns = DispatchTurns()  # thread instances on one GPU take turns queueing their work
        for index, ((group, device), host) in enumerate(zip(groups, process_hosts(groups))):
            context = _instance_context(name, config, config_json, version, index, device)
            context = dataclasses.replace(context, metrics=self.custom_metrics.view(object()))
            if host is None:
                assert model_class is not None
                instances.append(ModelInstance(model_class, context, run_config, self.faults, self.bls,
                                               turns.turn(device)))
                continue
            if host not in workers:
                workers[host] = worker_process(version.model_file, run_config)
            instances.append(ProcessInstance(version.model_file, context, run_config, self.faults, self.bls,
                                             workers[host]))

    async def _undo(
        self, name: str, version: VersionSource, instances: list[ModelInstance | ProcessInstance],
        model_class: ModelClass | None,
    ) -> None:
        """A load that failed (or was cancelled): close what it started, forget its faults
        (the next attempt logs its failures afresh) and its model module."""
        for instance in instances:
            await instance.close()
            _release_metrics(instance.context)
        self.faults.flush(name, version.version)
        if model_class is not None:
            unload_model_module(model_class)

    def _load_ensemble(self, source: ModelSource, version: VersionSource) -> ServingModel:
        """An ensemble version: its steps' models must serve and fit its config now (they
        are looked up again per request)."""
        config = source.config
        assert config is not None and config.ensemble_scheduling is not None
        if self.steps is None:
            raise ModelLoadError(source.name, f"ensemble '{source.name}': this server runs no ensembles")
        step_configs = []
        for step in config.ensemble_scheduling.step:
            wanted = None if step.model_version == -1 else step.model_version
            try:
                step_configs.append(self.steps.get(step.model_name, wanted).config)
            except NereidError as exc:
                if wanted is None:
                    problem = f"ensemble '{source.name}' depends on '{step.model_name}' which has no loaded version"
                else:
                    problem = (f"ensemble '{source.name}' depends on '{step.model_name}' whose required version "
                               f"{wanted} is not loaded")
                raise ModelLoadError(source.name, f"{problem}: {exc.message}", str(source.path)) from exc
        mismatch = ensemble_problem(config, step_configs)
        if mismatch is not None:
            raise ModelLoadError(source.name, mismatch, str(source.path))
        decoupled = decoupled_problem(config, step_configs)[1]
        if decoupled != config.decoupled:  # as Triton sets it: decoupled when a step is
            config = dataclasses.replace(config, model_transaction_policy=ModelTransactionPolicy(decoupled=decoupled))
        stats = ModelStats(source.name, version.version)
        scheduler = EnsembleScheduler(config, self.steps, stats)
        return ServingModel(source.name, version.version, config, to_triton_json(config), stats, scheduler, (), None)

    async def _start_instance(self, instance: ModelInstance | ProcessInstance) -> None:
        """Start one instance: a process instance in its worker process (started by the
        first of its instances), a thread instance here (constructors one at a time)."""
        if isinstance(instance, ProcessInstance):
            await instance.start()  # its own process: no import lock needed
            return
        async with self._construct_lock:
            await instance.start()

    async def close(self, serving: ServingModel) -> None:
        """Stop taking requests, let accepted ones finish (the batcher drains its queue and
        running batches), close the instances, and only then forget the model's modules.
        Past ``deadline`` (set at shutdown) batches still in the model are abandoned:
        their requests fail, the version is listed in ``abandoned`` and its instances
        close without waiting for model code."""
        serving.retired = True
        timeout = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
        if not await serving.batcher.aclose(timeout):
            self.abandoned.append(f"{serving.name}:{serving.version}")
            _log.error(
                "model '%s' version %d: a batch was still running in model code at the exit timeout "
                "(--exit-timeout-secs); abandoned, its requests failed", serving.name, serving.version,
            )
        for instance in serving.instances:
            await instance.close(abandoned=f"{serving.name}:{serving.version}" in self.abandoned)
            _release_metrics(instance.context)  # its metric families leave /metrics (as Triton's)
        self.faults.flush(serving.name, serving.version)  # its last repeats; a new load logs afresh
        if serving.model_class is not None:  # an ensemble has none
            unload_model_module(serving.model_class)


def batcher_for(name: str, config: ModelConfig, instances: Sequence[Instance], stats: ModelStats) -> DynamicBatcher:
    """The batcher of a served model, over its InferRequests: cost is rows (or the model's
    ``batch_size()``), requests whose shapes differ never share a batch (unless padded)."""
    cost_fn = instances[0].cost_function if instances else None
    batching = config.dynamic_batching is not None and config.max_batch_size > 0
    limit = config.max_batch_size

    rows_of: Callable[[InferRequest], int] = operator.attrgetter("rows")

    def cost_of(request: InferRequest) -> int:
        cost = request_cost(request, cost_fn)
        if batching and cost > limit:
            raise InvalidInputError(
                f"model '{name}': request cost {cost} (from Model.batch_size) exceeds max_batch_size {limit}",
                model=name,
            )
        return cost

    return DynamicBatcher(
        model_name=name,
        max_batch_size=config.max_batch_size,
        dynamic_batching=config.dynamic_batching,
        instances=instances,
        stats=stats,
        cost_of=rows_of if cost_fn is None else cost_of,
        signature_of=signature_function(config),
        rows_of=rows_of,
        streaming=config.decoupled,
        execution_timeout_ms=config.execution_timeout_ms,
        bundles=cost_fn is None and not any(instance.sees_requests for instance in instances),
    )


def _release_metrics(context: ModelContext) -> None:
    """Close the metric handles an instance's model code still held."""
    if isinstance(context.metrics, OwnedMetrics):
        context.metrics.release_all()


def _load_error(exc: BaseException, name: str, version: VersionSource) -> BaseException:
    """What a failed load raises: a ModelLoadError naming the model file (logged with its
    traceback when user code or the filesystem threw it); ``exc`` itself when it is one
    already, or not an Exception (a cancellation)."""
    if isinstance(exc, ModelLoadError) or not isinstance(exc, Exception):
        return exc
    if isinstance(exc, NereidError):
        return ModelLoadError(name, exc.message, str(version.model_file))
    _log.exception("loading %s:%d failed", name, version.version)
    return ModelLoadError(name, f"{version.model_file}: {describe_exception(exc)}", str(version.model_file))


def _instance_context(
    name: str, config: ModelConfig, config_json: dict[str, object], version: VersionSource, index: int, device: str
) -> ModelContext:
    """The ModelContext of instance ``index`` of a model version, on ``device``."""
    return ModelContext(
        model_name=name,
        model_version=version.version,
        instance_name=f"{name}_{index}",
        instance_index=index,
        device=device,
        kind="GPU" if device.startswith("cuda") else "CPU",
        config=config_json,
        parameters=dict(config.parameters),
        model_dir=version.path,
        max_batch_size=config.max_batch_size,
        device_id=int(device.split(":")[1]) if device.startswith("cuda") else None,
    )


def _load_labels(config: ModelConfig, version_dir: Path, model_dir: Path) -> dict[str, list[str]]:
    """Label files named by outputs' ``label_filename`` (looked up in the version folder,
    then the model folder), one label per line, for the classification extension."""
    labels: dict[str, list[str]] = {}
    for output in config.output:
        if not output.label_filename:
            continue
        for folder in (version_dir, model_dir):
            path = folder / output.label_filename
            if path.is_file():
                labels[output.name] = path.read_text(encoding="utf-8").splitlines()
                break
        else:
            raise ModelLoadError(
                config.name,
                f"{model_dir / output.label_filename}: label_filename of output "
                f"'{output.name}' not found",
            )
    return labels
