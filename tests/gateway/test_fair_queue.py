"""The wait queue's order (no processes): priority first, then the virtual token counter (VTC)."""

from tandem.gateway.fair_queue import FairQueue, Ticket


def serve_all(queue: FairQueue, output_tokens: int) -> list[str]:
    order = []
    while (ticket := queue.pop()) is not None:
        queue.charge(ticket.tenant, output_tokens=output_tokens)
        order.append(ticket.tenant)
    return order


def test_a_flooding_tenant_cannot_starve_one_that_arrives_later():
    queue = FairQueue(prompt_weight=1, output_weight=2)
    for _ in range(64):
        queue.push(Ticket("flood", 1, prompt_tokens=100))
    for _ in range(4):  # the flooder got service meanwhile
        ticket = queue.pop()
        queue.charge(ticket.tenant, output_tokens=200)
    for _ in range(3):
        queue.push(Ticket("interactive", 1, prompt_tokens=10))
    # FCFS would serve 60 flood requests first. VTC lifts the newcomer's counter to the flooder's (no
    # banked credit), so at most one more flood request goes first (a tie), then the newcomer's.
    order = serve_all(queue, output_tokens=20)
    assert order[:4].count("interactive") == 3 and len(order) == 63


def test_two_backlogged_tenants_get_service_within_the_vtc_bound():
    queue = FairQueue(prompt_weight=1, output_weight=2)
    cost = {"a": (100, 100), "b": (10, 20)}  # a's requests cost 300 weighted tokens, b's 50
    for _ in range(200):
        queue.push(Ticket("a", 0, prompt_tokens=cost["a"][0]))
        queue.push(Ticket("b", 0, prompt_tokens=cost["b"][0]))
    served = {"a": 0.0, "b": 0.0}
    for _ in range(150):
        ticket = queue.pop()
        queue.charge(ticket.tenant, output_tokens=cost[ticket.tenant][1])
        served[ticket.tenant] += cost[ticket.tenant][0] + 2 * cost[ticket.tenant][1]
        u = 300  # the largest request's weighted cost
        assert abs(served["a"] - served["b"]) <= 2 * u


def test_priority_comes_first_and_weights_share_within_a_class():
    queue = FairQueue()
    for _ in range(3):
        queue.push(Ticket("batch", 0, prompt_tokens=10))
    queue.push(Ticket("interactive", 1, prompt_tokens=10))
    assert queue.pop().tenant == "interactive"
    queue = FairQueue(prompt_weight=1, output_weight=0)
    for _ in range(30):
        queue.push(Ticket("heavy", 0, prompt_tokens=10, weight=2.0))
        queue.push(Ticket("light", 0, prompt_tokens=10, weight=1.0))
    first = [queue.pop().tenant for _ in range(30)]
    assert first.count("heavy") == 20  # weight 2: twice the service


def test_removed_tickets_leave_no_trace():
    queue = FairQueue()
    ticket = Ticket("a", 0, prompt_tokens=1)
    queue.push(ticket)
    assert queue.queued("a") == 1 and queue.remove(ticket) and len(queue) == 0 and queue.peek() is None
