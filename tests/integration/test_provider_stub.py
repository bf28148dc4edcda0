"""The stub as a provider (issue 31, point 4): a latency profile, 429s with Retry-After, bursts of
500s and `usage` in every reply. Draws are seeded and counted, never timed."""

from __future__ import annotations

import json
import statistics
import urllib.error
import urllib.request

from experiments.support.openai_stub import Faults, LatencyProfile, StubServer


def test_the_profile_draws_its_p50_and_p95() -> None:
    profile = LatencyProfile(p50_s=0.08, p95_s=0.25, first_byte_s=0.05, seed=3)
    draws = [profile.draw(f"question {n % 400}", n // 400) for n in range(4000)]
    cuts = statistics.quantiles(draws, n=20)
    assert 0.072 <= statistics.median(draws) <= 0.088
    assert 0.22 <= cuts[-1] <= 0.28  # the 95th percentile
    assert min(draws) >= 0.05  # never before the first byte
    # a function of the seed, the messages and their occurrence: any arrival order draws the same
    assert [profile.draw("question 7", 2), profile.draw("question 7", 0)] == [draws[807], draws[7]]
    other_seed = LatencyProfile(p50_s=0.08, p95_s=0.25, first_byte_s=0.05, seed=4)
    assert [other_seed.draw(f"question {n}", 0) for n in range(400)] != draws[:400]


def test_a_rerun_meets_the_same_latencies_in_any_order() -> None:
    """The stub draws by the request's messages: the same questions asked again (after
    /restart_draws), in another order, wait what they waited the first time."""
    profile = LatencyProfile(p50_s=0.001, p95_s=0.002, seed=5)
    bodies = [
        {"model": "m", "messages": [{"role": "user", "content": f"question {n}"}]} for n in range(4)
    ]
    with StubServer(profile=profile) as stub:
        url = stub.base_url
        for body in [*bodies, *reversed(bodies)]:
            if body is bodies[-1] and len(stub.log) == 4:
                urllib.request.urlopen(f"{url}/restart_draws", timeout=600).read()
            request = urllib.request.Request(
                f"{url}/chat/completions", json.dumps(body).encode(), method="POST"
            )
            request.add_header("content-type", "application/json")
            urllib.request.urlopen(request, timeout=600).read()
        served = json.loads(urllib.request.urlopen(f"{url}/served", timeout=600).read())["served"]
    first = {e["key"]: e["seconds"] for e in served[:4]}
    again = {e["key"]: e["seconds"] for e in served[4:]}
    assert first == again and len(set(first.values())) == 4


def test_faults_come_where_they_are_asked_for() -> None:
    faults = Faults(rate_limit_every=9, retry_after_s=0.3, burst_every=13, burst_length=2)
    replies = {n: faults.reply(n) for n in range(1, 30)}
    assert [n for n, r in replies.items() if r and r["status"] == 500] == [14, 15, 27, 28]
    assert [n for n, r in replies.items() if r and r["status"] == 429] == [9, 18]
    assert replies[9] == {"status": 429, "retry_after": 0.3}


def test_a_429_carries_retry_after_and_every_reply_its_usage() -> None:
    faults = Faults(rate_limit_every=2, retry_after_s=0.3)
    body = {"model": "m", "messages": [{"role": "user", "content": "How long does a torch burn?"}]}
    with StubServer(faults=faults) as stub:
        url = f"{stub.base_url}/chat/completions"
        codes, headers = [], []
        for _ in range(2):
            request = urllib.request.Request(url, json.dumps(body).encode(), method="POST")
            request.add_header("content-type", "application/json")
            try:
                with urllib.request.urlopen(request, timeout=600) as response:
                    codes.append(response.status)
                    reply = json.loads(response.read())
            except urllib.error.HTTPError as refused:
                codes.append(refused.code)
                headers.append(refused.headers.get("retry-after"))
    assert codes == [200, 429] and headers == ["0.3"]
    assert reply["usage"]["prompt_tokens"] > 0 and reply["usage"]["total_tokens"] > 0
    assert [entry["status"] for entry in stub.log] == [200, 429]
    assert stub.log[0]["usage"] == reply["usage"] and stub.log[1]["retry_after"] == "0.3"
