from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class OptimizerSpec(_message.Message):
    __slots__ = ("name", "lr", "beta1", "beta2", "eps", "initial_accumulator")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    BETA1_FIELD_NUMBER: _ClassVar[int]
    BETA2_FIELD_NUMBER: _ClassVar[int]
    EPS_FIELD_NUMBER: _ClassVar[int]
    INITIAL_ACCUMULATOR_FIELD_NUMBER: _ClassVar[int]
    name: str
    lr: float
    beta1: float
    beta2: float
    eps: float
    initial_accumulator: float
    def __init__(self, name: _Optional[str] = ..., lr: _Optional[float] = ..., beta1: _Optional[float] = ..., beta2: _Optional[float] = ..., eps: _Optional[float] = ..., initial_accumulator: _Optional[float] = ...) -> None: ...

class TableSpec(_message.Message):
    __slots__ = ("name", "dim", "init_std", "optimizer")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    INIT_STD_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    name: str
    dim: int
    init_std: float
    optimizer: OptimizerSpec
    def __init__(self, name: _Optional[str] = ..., dim: _Optional[int] = ..., init_std: _Optional[float] = ..., optimizer: _Optional[_Union[OptimizerSpec, _Mapping]] = ...) -> None: ...

class DenseSpec(_message.Message):
    __slots__ = ("name", "initial", "optimizer")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INITIAL_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    name: str
    initial: Tensor
    optimizer: OptimizerSpec
    def __init__(self, name: _Optional[str] = ..., initial: _Optional[_Union[Tensor, _Mapping]] = ..., optimizer: _Optional[_Union[OptimizerSpec, _Mapping]] = ...) -> None: ...

class DeclareRequest(_message.Message):
    __slots__ = ("tables", "dense")
    TABLES_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    tables: _containers.RepeatedCompositeFieldContainer[TableSpec]
    dense: _containers.RepeatedCompositeFieldContainer[DenseSpec]
    def __init__(self, tables: _Optional[_Iterable[_Union[TableSpec, _Mapping]]] = ..., dense: _Optional[_Iterable[_Union[DenseSpec, _Mapping]]] = ...) -> None: ...

class DeclareReply(_message.Message):
    __slots__ = ("dense_known",)
    DENSE_KNOWN_FIELD_NUMBER: _ClassVar[int]
    dense_known: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, dense_known: _Optional[_Iterable[str]] = ...) -> None: ...

class TableIds(_message.Message):
    __slots__ = ("table", "ids")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    table: str
    ids: Tensor
    def __init__(self, table: _Optional[str] = ..., ids: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("worker", "tables", "dense", "step", "finalize_step", "finalize_workers")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    FINALIZE_STEP_FIELD_NUMBER: _ClassVar[int]
    FINALIZE_WORKERS_FIELD_NUMBER: _ClassVar[int]
    worker: str
    tables: _containers.RepeatedCompositeFieldContainer[TableIds]
    dense: _containers.RepeatedScalarFieldContainer[str]
    step: int
    finalize_step: int
    finalize_workers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, worker: _Optional[str] = ..., tables: _Optional[_Iterable[_Union[TableIds, _Mapping]]] = ..., dense: _Optional[_Iterable[str]] = ..., step: _Optional[int] = ..., finalize_step: _Optional[int] = ..., finalize_workers: _Optional[_Iterable[str]] = ...) -> None: ...

class PullReply(_message.Message):
    __slots__ = ("rows", "dense", "version")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[Tensor]
    dense: _containers.RepeatedCompositeFieldContainer[Tensor]
    version: int
    def __init__(self, rows: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., dense: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., version: _Optional[int] = ...) -> None: ...

class BatchKey(_message.Message):
    __slots__ = ("epoch", "shard", "batch")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    shard: int
    batch: int
    def __init__(self, epoch: _Optional[int] = ..., shard: _Optional[int] = ..., batch: _Optional[int] = ...) -> None: ...

class TableGrad(_message.Message):
    __slots__ = ("table", "ids", "grads")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    GRADS_FIELD_NUMBER: _ClassVar[int]
    table: str
    ids: Tensor
    grads: Tensor
    def __init__(self, table: _Optional[str] = ..., ids: _Optional[_Union[Tensor, _Mapping]] = ..., grads: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class NamedTensor(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: Tensor
    def __init__(self, name: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class PushRequest(_message.Message):
    __slots__ = ("worker", "key", "version", "examples", "tables", "dense", "step", "step_workers")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STEP_WORKERS_FIELD_NUMBER: _ClassVar[int]
    worker: str
    key: BatchKey
    version: int
    examples: int
    tables: _containers.RepeatedCompositeFieldContainer[TableGrad]
    dense: _containers.RepeatedCompositeFieldContainer[NamedTensor]
    step: int
    step_workers: int
    def __init__(self, worker: _Optional[str] = ..., key: _Optional[_Union[BatchKey, _Mapping]] = ..., version: _Optional[int] = ..., examples: _Optional[int] = ..., tables: _Optional[_Iterable[_Union[TableGrad, _Mapping]]] = ..., dense: _Optional[_Iterable[_Union[NamedTensor, _Mapping]]] = ..., step: _Optional[int] = ..., step_workers: _Optional[int] = ...) -> None: ...

class PushReply(_message.Message):
    __slots__ = ("status", "version")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        APPLIED: _ClassVar[PushReply.Status]
        DUPLICATE: _ClassVar[PushReply.Status]
        STALE: _ClassVar[PushReply.Status]
        LATE: _ClassVar[PushReply.Status]
    APPLIED: PushReply.Status
    DUPLICATE: PushReply.Status
    STALE: PushReply.Status
    LATE: PushReply.Status
    STATUS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    status: PushReply.Status
    version: int
    def __init__(self, status: _Optional[_Union[PushReply.Status, str]] = ..., version: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsReply(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CheckpointReply(_message.Message):
    __slots__ = ("path", "version")
    PATH_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    path: str
    version: int
    def __init__(self, path: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class DatasetSpec(_message.Message):
    __slots__ = ("examples", "shard_size", "batch_size", "epochs", "shuffle_seed")
    EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    SHARD_SIZE_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_SEED_FIELD_NUMBER: _ClassVar[int]
    examples: int
    shard_size: int
    batch_size: int
    epochs: int
    shuffle_seed: int
    def __init__(self, examples: _Optional[int] = ..., shard_size: _Optional[int] = ..., batch_size: _Optional[int] = ..., epochs: _Optional[int] = ..., shuffle_seed: _Optional[int] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("worker", "dataset")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    worker: str
    dataset: DatasetSpec
    def __init__(self, worker: _Optional[str] = ..., dataset: _Optional[_Union[DatasetSpec, _Mapping]] = ...) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ("lease_s", "mode")
    LEASE_S_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    lease_s: float
    mode: str
    def __init__(self, lease_s: _Optional[float] = ..., mode: _Optional[str] = ...) -> None: ...

class WorkerRequest(_message.Message):
    __slots__ = ("worker",)
    WORKER_FIELD_NUMBER: _ClassVar[int]
    worker: str
    def __init__(self, worker: _Optional[str] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("known",)
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    known: bool
    def __init__(self, known: _Optional[bool] = ...) -> None: ...

class Shard(_message.Message):
    __slots__ = ("epoch", "id", "start", "end")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    id: int
    start: int
    end: int
    def __init__(self, epoch: _Optional[int] = ..., id: _Optional[int] = ..., start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class AcquireReply(_message.Message):
    __slots__ = ("status", "shard")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        GRANTED: _ClassVar[AcquireReply.Status]
        WAIT: _ClassVar[AcquireReply.Status]
        FINISHED: _ClassVar[AcquireReply.Status]
    GRANTED: AcquireReply.Status
    WAIT: AcquireReply.Status
    FINISHED: AcquireReply.Status
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    status: AcquireReply.Status
    shard: Shard
    def __init__(self, status: _Optional[_Union[AcquireReply.Status, str]] = ..., shard: _Optional[_Union[Shard, _Mapping]] = ...) -> None: ...

class CompleteRequest(_message.Message):
    __slots__ = ("worker", "epoch", "shard")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    worker: str
    epoch: int
    shard: int
    def __init__(self, worker: _Optional[str] = ..., epoch: _Optional[int] = ..., shard: _Optional[int] = ...) -> None: ...

class CompleteReply(_message.Message):
    __slots__ = ("accepted",)
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    def __init__(self, accepted: _Optional[bool] = ...) -> None: ...

class BeginStepRequest(_message.Message):
    __slots__ = ("worker", "has_batch")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    HAS_BATCH_FIELD_NUMBER: _ClassVar[int]
    worker: str
    has_batch: bool
    def __init__(self, worker: _Optional[str] = ..., has_batch: _Optional[bool] = ...) -> None: ...

class BeginStepReply(_message.Message):
    __slots__ = ("retry", "step", "members", "finalize_step", "finalize_workers")
    RETRY_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    FINALIZE_STEP_FIELD_NUMBER: _ClassVar[int]
    FINALIZE_WORKERS_FIELD_NUMBER: _ClassVar[int]
    retry: bool
    step: int
    members: _containers.RepeatedScalarFieldContainer[str]
    finalize_step: int
    finalize_workers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, retry: _Optional[bool] = ..., step: _Optional[int] = ..., members: _Optional[_Iterable[str]] = ..., finalize_step: _Optional[int] = ..., finalize_workers: _Optional[_Iterable[str]] = ...) -> None: ...

class QueueRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class QueueReply(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...
