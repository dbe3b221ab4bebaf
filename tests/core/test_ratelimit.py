from api.ratelimit import RateLimiter


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_burst_then_limited_then_refilled():
    clock = Clock()
    rl = RateLimiter(per_second=2, burst=3, clock=clock)
    assert [rl.allow("a") for _ in range(3)] == [0, 0, 0]
    wait = rl.allow("a")
    assert 0 < wait <= 0.5
    clock.now += 0.5
    assert rl.allow("a") == 0


def test_senders_do_not_share_a_bucket():
    rl = RateLimiter(per_second=1, burst=1, clock=Clock())
    assert rl.allow("a") == 0
    assert rl.allow("a") > 0
    assert rl.allow("b") == 0


def test_zero_rate_disables_the_limit():
    rl = RateLimiter(per_second=0, burst=1, clock=Clock())
    assert all(rl.allow("a") == 0 for _ in range(1000))


def test_the_table_stays_bounded():
    clock = Clock()
    rl = RateLimiter(per_second=1, burst=1, max_users=100, clock=clock)
    for i in range(1000):
        rl.allow(f"u{i}")
        clock.now += 0.001
    assert len(rl._buckets) <= 100
