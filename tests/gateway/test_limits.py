"""Rate limits and budgets as pure decisions on a clock given as data."""

from tandem.deployment.tenants import Budget, Limits, Tenant
from tandem.gateway.limits import DAY_S, TenantState, admit, charge, finish, ratelimit_headers, reset_text

T0 = 100 * DAY_S + 3600.0  # 01:00 UTC on some day


def test_rpm_bucket_refuses_past_the_limit_and_refills_continuously():
    tenant = Tenant("a", limits=Limits(rpm=2))
    state = TenantState()
    for _ in range(2):
        verdict, state = admit(state, tenant, T0, 10)
        assert verdict.allowed
    verdict, state = admit(state, tenant, T0, 10)
    assert not verdict.allowed and verdict.limit == "rpm" and verdict.retry_after_s == 30.0
    verdict, _ = admit(state, tenant, T0 + 30.0, 10)  # 2 per minute: one back after 30 s
    assert verdict.allowed
    headers = ratelimit_headers(state, tenant, T0)
    assert headers == {
        "x-ratelimit-limit-requests": "2", "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1m0s"
    }  # fmt: skip


def test_tpm_counts_prompt_at_admission_and_output_as_it_streams():
    tenant = Tenant("a", limits=Limits(tpm=100))
    verdict, state = admit(TenantState(), tenant, T0, 30)
    assert verdict.allowed
    state = charge(state, tenant, T0, tokens=80)  # streamed output: the bucket is now below zero
    verdict, state = admit(state, tenant, T0, 1)
    assert not verdict.allowed and verdict.limit == "tpm"
    assert 6.0 < verdict.retry_after_s <= 7.0  # 11 tokens short at 100/min
    assert ratelimit_headers(state, tenant, T0)["x-ratelimit-remaining-tokens"] == "0"


def test_max_concurrency_counts_requests_in_flight():
    tenant = Tenant("a", limits=Limits(max_concurrency=1))
    verdict, state = admit(TenantState(), tenant, T0, 1)
    assert verdict.allowed
    assert admit(state, tenant, T0, 1)[0].limit == "max_concurrency"
    assert admit(finish(state), tenant, T0, 1)[0].allowed


def test_a_daily_budget_stops_a_tenant_until_the_next_utc_day():
    tenant = Tenant("a", budget=Budget(tokens_per_day=100))
    verdict, state = admit(TenantState(), tenant, T0, 40)
    state = charge(state, tenant, T0, tokens=60)
    verdict, state = admit(state, tenant, T0 + 60, 1)
    assert not verdict.allowed and verdict.limit == "tokens_per_day"
    assert verdict.retry_after_s == DAY_S - 3600.0 - 60  # until 00:00 UTC
    assert not admit(state, tenant, 101 * DAY_S - 1, 1)[0].allowed
    assert admit(state, tenant, 101 * DAY_S, 1)[0].allowed  # midnight: a new day's budget


def test_a_dollar_budget_counts_attributed_dollars():
    tenant = Tenant("a", budget=Budget(dollars_per_day=0.5))
    state = charge(TenantState(), tenant, T0, dollars=0.5)
    verdict, _ = admit(state, tenant, T0, 1)
    assert verdict.limit == "dollars_per_day" and "$0.5" in verdict.message


def test_reset_durations_are_written_as_openai_does():
    assert [reset_text(s) for s in (0.02, 1.0, 59.2, 360, 3700)] == ["20ms", "1s", "1m0s", "6m0s", "1h1m40s"]
