from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PullRequest(_message.Message):
    __slots__ = ("request_id", "block_ids", "max_chunk_bytes", "consumer_id", "attempt", "ticket")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    max_chunk_bytes: int
    consumer_id: str
    attempt: int
    ticket: str
    def __init__(self, request_id: _Optional[str] = ..., block_ids: _Optional[_Iterable[int]] = ..., max_chunk_bytes: _Optional[int] = ..., consumer_id: _Optional[str] = ..., attempt: _Optional[int] = ..., ticket: _Optional[str] = ...) -> None: ...

class BlockChunk(_message.Message):
    __slots__ = ("pieces",)
    PIECES_FIELD_NUMBER: _ClassVar[int]
    pieces: _containers.RepeatedCompositeFieldContainer[BlockPiece]
    def __init__(self, pieces: _Optional[_Iterable[_Union[BlockPiece, _Mapping]]] = ...) -> None: ...

class BlockPiece(_message.Message):
    __slots__ = ("block_id", "block_index", "block_bytes", "crc32", "offset", "data")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_INDEX_FIELD_NUMBER: _ClassVar[int]
    BLOCK_BYTES_FIELD_NUMBER: _ClassVar[int]
    CRC32_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    block_index: int
    block_bytes: int
    crc32: int
    offset: int
    data: bytes
    def __init__(self, block_id: _Optional[int] = ..., block_index: _Optional[int] = ..., block_bytes: _Optional[int] = ..., crc32: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class DoneRequest(_message.Message):
    __slots__ = ("request_id", "success", "consumer_id", "reason", "ticket")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    success: bool
    consumer_id: str
    reason: str
    ticket: str
    def __init__(self, request_id: _Optional[str] = ..., success: _Optional[bool] = ..., consumer_id: _Optional[str] = ..., reason: _Optional[str] = ..., ticket: _Optional[str] = ...) -> None: ...

class DoneAck(_message.Message):
    __slots__ = ("first_report",)
    FIRST_REPORT_FIELD_NUMBER: _ClassVar[int]
    first_report: bool
    def __init__(self, first_report: _Optional[bool] = ...) -> None: ...

class HealthCheckRequest(_message.Message):
    __slots__ = ("service",)
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    service: str
    def __init__(self, service: _Optional[str] = ...) -> None: ...

class HealthCheckResponse(_message.Message):
    __slots__ = ("status",)
    class ServingStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNKNOWN: _ClassVar[HealthCheckResponse.ServingStatus]
        SERVING: _ClassVar[HealthCheckResponse.ServingStatus]
        NOT_SERVING: _ClassVar[HealthCheckResponse.ServingStatus]
    UNKNOWN: HealthCheckResponse.ServingStatus
    SERVING: HealthCheckResponse.ServingStatus
    NOT_SERVING: HealthCheckResponse.ServingStatus
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: HealthCheckResponse.ServingStatus
    def __init__(self, status: _Optional[_Union[HealthCheckResponse.ServingStatus, str]] = ...) -> None: ...
