"""http/h1/state.py: the moves an HTTP/1.1 connection may make (the connection's tests
drive it through them)."""

from __future__ import annotations

from nereid.http.h1.state import TRANSITIONS, ConnectionState


def test_the_transition_table_never_leads_back_to_reading_and_every_state_can_close() -> None:
    assert set(TRANSITIONS) == set(ConnectionState)
    for state, reachable in TRANSITIONS.items():
        assert ConnectionState.CLOSED in reachable, state
        assert ConnectionState.OPEN not in reachable, state
    assert TRANSITIONS[ConnectionState.LINGERING] == {ConnectionState.CLOSED}
    assert TRANSITIONS[ConnectionState.CLOSED] == {ConnectionState.CLOSED}
