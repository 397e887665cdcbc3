"""A short fuzzing run against a live daemon (the long one: tests/benchmarks/bench_fuzz.py)."""

from __future__ import annotations


import pytest

from support.fuzz_messages import FUZZ_MODELS, MALFORMED, VALID, MessageFactory, fuzz_specs, run_fuzz


@pytest.mark.slow
def test_fuzzed_messages_are_all_answered_and_the_daemon_survives(make_daemon, engines):
    daemon = make_daemon(FUZZ_MODELS)
    factory = MessageFactory(fuzz_specs(engines), seed=1)
    report = run_fuzz(daemon.endpoint, factory, 5000, sockets=8, timeout_s=5.0, alive=daemon.alive)
    print(report.summary())
    assert report.clean, "\n".join(report.failures)
    assert report.malformed > 2000 and report.valid > 1000
    assert report.malformed_4xx == report.malformed and report.valid_ok == report.valid
    assert daemon.alive() and "Traceback" not in daemon.log()


def test_the_factory_labels_what_it_makes(engines):
    # The labels are the oracle: a valid message must parse, a malformed one must not.
    from infermux.protocol import ProtocolError, parse_request

    factory = MessageFactory(fuzz_specs(engines), seed=2)
    kinds = set()
    for _ in range(2000):
        message = factory.next()
        kinds.add(message.kind)
        if message.expect == VALID:
            request = parse_request(message.frames)
            assert request.model == message.model.name
        elif message.expect == MALFORMED and message.kind.startswith(("bad_json", "garbage", "deep_", "not_an")):
            with pytest.raises(ProtocolError):
                parse_request(message.frames)
    assert len(kinds) > 30, sorted(kinds)
