"""The HTTP API's edges without a runtime: request models, cursors, frames, limits, error mapping.

A stub stands in for :class:`~threads_celery.client.threads.Threads` (the API only calls its methods), so
these tests need no database, broker or worker.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from threads_celery.api.app import create_api
from threads_celery.api.auth import auth_from_env, tokens_from_env
from threads_celery.api.bodies import Approve, Deny, Resolve, StartRun
from threads_celery.api.body_limit import max_body_from_env
from threads_celery.api.errors import ERROR_STATUS, ApiError
from threads_celery.api.events import parse_cursor, sse_frame
from threads_celery.api.tenancy import parse_token_entry
from threads_celery.exceptions import (
    BranchPointNotFound,
    BrokerUnavailable,
    CallNotFound,
    CallStateError,
    ConfigError,
    FenceLost,
    HistoryRefused,
    InvalidArguments,
    ModelUnavailable,
    PayloadTooLarge,
    RunNotFound,
    StoreUnavailable,
    ThreadBusy,
    ThreadNotFound,
    UnknownAgent,
)
from threads_celery.records import Event, Run, RunHandle

TOKEN = "unit-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class StubThreads:
    """Answers like Threads; ``fail_with`` makes every call raise that exception instead."""

    def __init__(self) -> None:
        self.is_embedded = True  # /readyz counts the in-process worker, no broker to ping
        self.fail_with: BaseException | None = None
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def _call(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((name, args, kwargs))
        if self.fail_with is not None:
            raise self.fail_with

    def tenant_of(self, **ids: str | None) -> str | None:
        return "default"  # every id is the (default-tenant) caller's; ownership is tested end to end

    def start(
        self,
        agent: str,
        message: str,
        thread_id: str | None = None,
        *,
        run_id: str | None = None,
        tenant: str | None = None,
    ) -> RunHandle:
        self._call("start", agent, message, thread_id=thread_id, run_id=run_id)
        return RunHandle(run_id=run_id or "run_1", thread_id=thread_id or "thread_1")

    def get_run(self, run_id: str) -> Run:
        self._call("get_run", run_id)
        return Run(
            id=run_id,
            thread_id="thread_1",
            agent="a",
            status="running",
            step=1,
            fence=3,
            input="hi",
            lease_owner="host-7",
        )

    def runs(self, **kwargs: Any) -> list[Run]:
        self._call("runs", **kwargs)
        return []

    def parked(self) -> list[Any]:
        self._call("parked")
        return []

    def approve(self, effect_key: str, **kwargs: Any) -> None:
        self._call("approve", effect_key, **kwargs)

    def deny(self, effect_key: str, reason: str, **kwargs: Any) -> None:
        self._call("deny", effect_key, reason, **kwargs)

    def resolve(self, effect_key: str, resolution: str, **kwargs: Any) -> None:
        self._call("resolve", effect_key, resolution, **kwargs)


@pytest.fixture
def stub() -> StubThreads:
    return StubThreads()


@pytest.fixture
def client(stub: StubThreads) -> Iterator[TestClient]:
    with TestClient(create_api(stub, tokens={TOKEN}), raise_server_exceptions=False) as test_client:  # type: ignore[arg-type]
        yield test_client


# -- request models ----------------------------------------------------------------------------


def test_start_run_accepts_the_documented_fields_and_nothing_else() -> None:
    body = StartRun.model_validate({"agent": "a", "message": "hi", "thread_id": "t-1", "run_id": "run_x"})
    assert (body.agent, body.message, body.thread_id, body.run_id) == ("a", "hi", "t-1", "run_x")
    for bad in (
        {"agent": "a"},  # no message
        {"agent": "", "message": "x"},
        {"agent": "a", "message": "x", "extra": 1},
        {"agent": "a", "message": 3},
        {"agent": "a", "message": "x", "thread_id": "has space"},
        {"agent": "a", "message": "x", "thread_id": "x" * 65},
        {"agent": "a", "message": "x", "run_id": "-leading-dash"},
        {"agent": "a", "message": "a\x00b"},
    ):
        with pytest.raises(ValidationError):
            StartRun.model_validate(bad)


def test_decision_bodies_need_a_reason_and_a_known_resolution_and_no_principal() -> None:
    assert Approve.model_validate({"principal": "ops", "override_args": {"to": "b"}}).override_args == {"to": "b"}
    assert Deny.model_validate({"reason": "no"}).principal is None
    assert Resolve.model_validate({"resolution": "assume_not_done", "principal": "ann"}).result is None
    # The API records the token's principal; one in the body is optional (and ignored).
    assert Approve.model_validate({}).principal is None
    assert Resolve.model_validate({"resolution": "assume_done"}).principal is None
    for model, bad in (
        (Approve, {"principal": ""}),
        (Approve, {"principal": "ops", "override_args": [1, 2]}),
        (Deny, {"reason": ""}),
        (Deny, {"reason": "no", "principal": "a\x00"}),
        (Resolve, {"resolution": "assume_maybe", "principal": "ann"}),
        (Resolve, {"resolution": "assume_done", "principal": "ann", "extra": True}),
    ):
        with pytest.raises(ValidationError):
            model.model_validate(bad)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)
bodies = st.dictionaries(
    st.sampled_from(
        ["agent", "message", "thread_id", "run_id", "principal", "reason", "resolution", "result", "override_args", "x"]
    ),
    json_values,
    max_size=5,
)


@given(body=bodies)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_json_body_either_validates_or_is_a_validation_error(body: dict[str, Any]) -> None:
    for model in (StartRun, Approve, Deny, Resolve):
        try:
            parsed = model.model_validate(body)
        except ValidationError:
            continue
        # What validates holds no NUL and no key the model does not declare.
        assert set(body) <= set(model.model_fields)
        assert "\x00" not in json.dumps(parsed.model_dump())


def test_any_json_body_to_any_route_is_answered_below_500() -> None:
    stub = StubThreads()
    paths = ("/v1/runs", "/v1/calls/run_1:0:0/approve", "/v1/calls/run_1:0:0/deny", "/v1/calls/run_1:0:0/resolve")
    with TestClient(create_api(stub, tokens={TOKEN}), raise_server_exceptions=True) as c:  # type: ignore[arg-type]

        @given(body=bodies, path=st.sampled_from(paths))
        @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
        def answered(body: dict[str, Any], path: str) -> None:
            response = c.post(path, json=body, headers=AUTH)
            assert response.status_code in (200, 202, 422), (path, response.text)
            if response.status_code == 422:
                assert response.json()["error"]["type"] == "validation_error"

        answered()


def test_nan_and_infinity_are_not_json_and_are_refused(client: TestClient, stub: StubThreads) -> None:
    for path, raw in (
        ("/v1/calls/k:0:0/resolve", b'{"resolution": "assume_done", "principal": "a", "result": Infinity}'),
        ("/v1/calls/k:0:0/resolve", b'{"resolution": "assume_done", "principal": "a", "result": {"x": [NaN]}}'),
        ("/v1/calls/k:0:0/approve", b'{"principal": "a", "override_args": {"n": -Infinity}}'),
    ):
        response = client.post(path, content=raw, headers={**AUTH, "Content-Type": "application/json"})
        assert response.status_code == 422 and "NaN and Infinity" in response.json()["error"]["message"], raw
    assert stub.calls == []
    finite = client.post(
        "/v1/calls/k:0:0/resolve",
        content=b'{"resolution": "assume_done", "principal": "a", "result": {"x": [1.5e300]}}',
        headers={**AUTH, "Content-Type": "application/json"},
    )
    assert finite.status_code == 200


# -- cursors and frames ------------------------------------------------------------------------


def test_cursor_comes_from_last_event_id_first_then_after() -> None:
    assert parse_cursor(None, None) == 0
    assert parse_cursor(None, 7) == 7
    assert parse_cursor("12", 7) == 12
    assert parse_cursor("  ", 7) == 7
    for bad in ("-1", "1.5", "abc", "0x10"):
        with pytest.raises(ApiError) as raised:
            parse_cursor(bad, None)
        assert (raised.value.status, raised.value.type) == (400, "invalid_cursor")


def test_an_sse_frame_is_id_event_and_one_line_of_json() -> None:
    at = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    event = Event(
        thread_id="t",
        seq=42,
        type="message",
        payload={"text": "two\nlines", "role": "assistant"},
        run_id="r",
        created_at=at,
    )
    frame = sse_frame(event)
    assert frame.endswith("\n\n") and frame.count("\n") == 4
    lines = frame.rstrip("\n").split("\n")
    assert lines[0] == "id: 42" and lines[1] == "event: message"
    data = json.loads(lines[2].removeprefix("data: "))
    assert data == {
        "thread_id": "t",
        "seq": 42,
        "type": "message",
        "run_id": "r",
        "payload": {"text": "two\nlines", "role": "assistant"},
        "created_at": "2025-01-02T03:04:05Z",
    }


# -- configuration -----------------------------------------------------------------------------


def test_configuration_from_the_environment() -> None:
    assert tokens_from_env({"THREADS_API_TOKENS": " a,, b ,"}) == {"a", "b"}
    assert tokens_from_env({}) == set()
    assert auth_from_env({}) is True and auth_from_env({"THREADS_API_AUTH": "OFF"}) is False
    with pytest.raises(ConfigError):
        auth_from_env({"THREADS_API_AUTH": "sometimes"})
    assert max_body_from_env({}) == 1 << 20 and max_body_from_env({"THREADS_API_MAX_BODY_BYTES": "512"}) == 512
    for bad in ("0", "-5", "1MB"):
        with pytest.raises(ConfigError):
            max_body_from_env({"THREADS_API_MAX_BODY_BYTES": bad})
    with pytest.raises(ConfigError):
        create_api(StubThreads(), tokens={TOKEN}, max_body_bytes=0)  # type: ignore[arg-type]


# -- error mapping -----------------------------------------------------------------------------

LIBRARY_ERRORS = [
    (UnknownAgent("agent 'x' is not registered"), 404, "unknown_agent"),
    (RunNotFound("run_1"), 404, "run_not_found"),
    (ThreadNotFound("thread_1"), 404, "thread_not_found"),
    (CallNotFound("k"), 404, "call_not_found"),
    (CallStateError("k", "completed", "parked"), 409, "call_state_conflict"),
    (ThreadBusy("thread_1", "run_1"), 409, "thread_busy"),
    (BranchPointNotFound("thread_1", 4), 404, "message_not_found"),
    (HistoryRefused("t", "not erased: thread t is running: run r has not finished"), 409, "history_refused"),
    (InvalidArguments("override arguments rejected"), 422, "invalid_arguments"),
    (PayloadTooLarge(10, 5), 413, "payload_too_large"),
    (StoreUnavailable("cannot reach the database at postgresql://u:pw-secret@db/x"), 503, "store_unavailable"),
    (BrokerUnavailable("cannot reach the broker at redis://:pw-secret@r:6379/0"), 503, "broker_unavailable"),
    (ConfigError("thread 't' belongs to agent 'b', not 'a'"), 409, "conflict"),
    (
        ModelUnavailable("model 'openai:gpt-4o-mini' needs the 'openai' extra: pip install 'threads-celery[openai]'"),
        409,
        "model_unavailable",
    ),
    (FenceLost("run_1", 3), 500, "internal_error"),  # a library error with no mapping is internal
    (RuntimeError("pw-secret in a bug"), 500, "internal_error"),
]


@pytest.mark.parametrize(("exc", "status", "kind"), LIBRARY_ERRORS, ids=[type(e[0]).__name__ for e in LIBRARY_ERRORS])
def test_each_library_error_has_its_status_and_a_clean_body(
    client: TestClient, stub: StubThreads, exc: Exception, status: int, kind: str
) -> None:
    stub.fail_with = exc
    response = client.post("/v1/calls/run_1:0:0/approve", json={"principal": "ops"}, headers=AUTH)
    assert response.status_code == status
    assert response.json() == {"error": {"type": kind, "message": response.json()["error"]["message"]}}
    assert response.json()["error"]["message"]
    assert "pw-secret" not in response.text and "Traceback" not in response.text


def test_every_mapped_error_class_is_covered_above() -> None:
    assert set(ERROR_STATUS) <= {type(e) for e, _, _ in LIBRARY_ERRORS}


def test_routes_pass_the_validated_fields_through(client: TestClient, stub: StubThreads) -> None:
    started = client.post(
        "/v1/runs", json={"agent": "a", "message": "m", "thread_id": "t1", "run_id": "r1"}, headers=AUTH
    )
    assert started.status_code == 202 and started.json() == {"run_id": "r1", "thread_id": "t1", "status": "queued"}
    client.post("/v1/calls/k:0:0/approve", json={"principal": "ops", "override_args": {"n": 1}}, headers=AUTH)
    client.post("/v1/calls/k:0:1/approve", json={"principal": "ops", "remember": True}, headers=AUTH)
    client.post("/v1/calls/k:0:0/deny", json={"reason": "no"}, headers=AUTH)
    client.post(
        "/v1/calls/k:0:0/resolve", json={"resolution": "assume_done", "principal": "ann", "result": [1]}, headers=AUTH
    )
    client.get("/v1/runs", params={"status": "parked", "limit": 5}, headers=AUTH)
    # Decisions are recorded under the token's principal, never the name in the body.
    token_principal = parse_token_entry(TOKEN)[1].principal
    assert token_principal.startswith("api:") and TOKEN not in token_principal
    assert stub.calls == [
        ("start", ("a", "m"), {"thread_id": "t1", "run_id": "r1"}),
        ("approve", ("k:0:0",), {"principal": token_principal, "override_args": {"n": 1}, "remember": False}),
        ("approve", ("k:0:1",), {"principal": token_principal, "override_args": None, "remember": True}),
        ("deny", ("k:0:0", "no"), {"principal": token_principal}),
        ("resolve", ("k:0:0", "assume_done"), {"principal": token_principal, "result": [1]}),
        ("runs", (), {"thread_id": None, "status": "parked", "limit": 5, "tenant": "default"}),
    ]
    run = client.get("/v1/runs/run_9", headers=AUTH).json()
    assert run["id"] == "run_9" and "fence" not in run and "lease_owner" not in run


def test_path_ids_that_no_record_can_have_are_422_not_a_lookup(client: TestClient, stub: StubThreads) -> None:
    assert client.get("/v1/runs/has%20space", headers=AUTH).status_code == 422
    assert client.post("/v1/calls/%00bad/approve", json={"principal": "ops"}, headers=AUTH).status_code == 422
    assert stub.calls == []
