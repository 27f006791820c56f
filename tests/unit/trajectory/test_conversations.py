"""Several conversations in one session: each starts a Segment labelled ``new_conversation``.

Prompts are ChatML-shaped token ids (``<|im_start|>`` / ``<|im_end|>`` are the special ids), so the
token rule of :meth:`Session.shares_opening` reads each prompt's first message as a template would.
"""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dressage.trajectory import build_segments
from trajgen import call, fake_logprobs, new_session

START, END = 256, 257
SPECIAL = {START, END}
SYSTEM, USER, ASSISTANT = 115, 117, 97      # the role words after <|im_start|>


def block(role, body):
    return [START, role, 10, *body, END, 10]


def opening(conv):
    """Conversation ``conv``'s system prompt: every conversation's starts alike, then differs."""
    return block(SYSTEM, [60, 61, 62, 70 + conv, 80 + conv])


def turns(conv, n):
    """The (prompt, response) pairs of ``n`` turns of conversation ``conv``, each extending the last."""
    prompt = opening(conv) + block(USER, [40 + conv, 41]) + [START, ASSISTANT, 10]
    out = []
    for t in range(n):
        response = [30 + conv, 31 + t, END]
        out.append((prompt, response))
        prompt = prompt + response + [10] + block(USER, [50 + t]) + [START, ASSISTANT, 10]
    return out


def compressed(conv):
    """Conversation ``conv`` after its history was compressed: its system prompt, then a summary."""
    return opening(conv) + block(USER, [90, 91, 92]) + [START, ASSISTANT, 10]


def labels(session):
    return {s.step_id: s.boundary.reason for s in session.steps.values() if s.parent_id is None}


@st.composite
def interleavings(draw):
    """Turns of 2-4 conversations, committed in a random order that keeps each conversation's own."""
    counts = draw(st.lists(st.integers(1, 3), min_size=2, max_size=4))
    queue = [c for c, n in enumerate(counts) for _ in range(n)]
    order = draw(st.permutations(queue))
    return counts, order


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(interleavings(), st.booleans())
def test_every_conversation_opens_a_segment_labelled_new_conversation_in_any_order(plan, rewrite):
    counts, order = plan
    s = new_session(r3=False, special_ids=SPECIAL)
    taken = [0] * len(counts)
    pairs = [turns(c, n) for c, n in enumerate(counts)]
    firsts = {}
    for conv in order:
        prompt, response = pairs[conv][taken[conv]]
        rec = call(s, prompt, response)
        if taken[conv] == 0:
            firsts[conv] = rec.step_id
        else:
            assert rec.parent_id is not None          # a conversation's own turns extend it
        taken[conv] += 1
    if rewrite:
        squeezed = call(s, compressed(order[-1]), [33, END])
        assert squeezed.boundary.reason == "history_rewrite"
    roots = labels(s)
    first = min(firsts.values())
    assert roots[first] == "new_session"
    assert all(roots[step] == "new_conversation" for conv, step in firsts.items() if step != first)
    segments = build_segments(s)
    assert len(segments) == len(counts) + rewrite                # one Segment per conversation (TITO held)
    assert sorted(seg.boundary_reason for seg in segments).count("new_conversation") == len(counts) - 1


@settings(max_examples=40, deadline=None)
@given(st.permutations(range(3)))
def test_a_root_routed_before_others_committed_is_labelled_by_what_is_there_at_commit(order):
    # Three conversations' first calls are all routed on an empty session (in flight together);
    # whichever commits first is the new_session, the others new_conversation.
    s = new_session(r3=False, special_ids=SPECIAL)
    firsts = [turns(c, 1)[0] for c in range(3)]
    decisions = [s.route(np.asarray(p, np.int32)) for p, _ in firsts]
    assert all(d.boundary.reason == "new_session" for d in decisions)
    committed = []
    for k, conv in enumerate(order):
        prompt, response = firsts[conv]
        resp = np.asarray(response, np.int32)
        rec = s.prepare_step(decisions[conv], prompt_ids=prompt, response_ids=resp,
                             logprobs=fake_logprobs(resp, 0))
        if k == 0:
            # prepared before the others committed, placed after: its reason follows the session then
            late = rec
            continue
        committed.append(s.insert_step(s.rebase(rec)))
    placed = s.insert_step(s.rebase(late))
    assert [r.boundary.reason for r in committed] == ["new_session", "new_conversation"]
    assert placed.boundary.reason == "new_conversation"


def test_a_title_call_beside_the_agent_loop_is_a_new_conversation_by_its_messages():
    # OpenCode: the agent loop (system prompt + tools) and a title call (another system prompt, no
    # tools). Here their token ids share more than a template preamble, so only the messages tell.
    s = new_session(r3=False)
    agent_msgs = [{"role": "system", "content": "You are opencode."}, {"role": "user", "content": "fix the bug"}]
    title_msgs = [{"role": "system", "content": "You are a title generator."},
                  {"role": "user", "content": "fix the bug"}]
    tools = [{"type": "function", "function": {"name": "bash"}}]
    call(s, [1, 2, 3, 4, 5], [30, 31], tools=tools, messages=agent_msgs)
    title = call(s, [1, 2, 3, 9, 9], [40], messages=title_msgs)
    assert title.boundary.reason == "new_conversation"
    # a sub-agent: the same system prompt but other tools
    sub = call(s, [1, 2, 3, 7, 7], [41], tools=[{"type": "function", "function": {"name": "read"}}],
               messages=agent_msgs)
    assert sub.boundary.reason == "new_conversation"
    # the agent's own history compressed: the same system prompt and tools, a summary after it
    squeezed = call(s, [1, 2, 3, 4, 8], [42], tools=tools,
                    messages=agent_msgs[:1] + [{"role": "user", "content": "summary: ..."}])
    assert squeezed.boundary.reason == "history_rewrite" and squeezed.boundary.candidate_step == 0


def test_token_rule_reads_the_first_message_of_a_chatml_prompt():
    s = new_session(r3=False, special_ids=SPECIAL)
    (p0, r0), = turns(0, 1)
    call(s, p0, r0)
    # another system prompt that begins alike: the shared prefix ends inside the first message
    other = call(s, opening(1) + block(USER, [41]) + [START, ASSISTANT, 10], [35, END])
    assert other.boundary.reason == "new_conversation"
    again = call(s, compressed(0), [36, END])
    assert again.boundary.reason == "history_rewrite"
