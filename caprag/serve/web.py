"""The chat page and its HTML fragments (rendered with escaping; HTMX does the requests)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from html import escape

from caprag.config import PowerChoice, power_label
from caprag.schemas import Source
from caprag.serve.conversation import Turn
from caprag.serve.decision_log import DecisionRecord, Feedback, Round
from caprag.serve.services import AskResult

HTMX = "/static/vendor/htmx-2.0.11.min.js"

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>caprag — ask the rulebooks</title>
<script src="{htmx}"></script>
<style>
 body {{ font-family: system-ui, sans-serif; max-width: 52rem; margin: 2rem auto; padding: 0 1rem;
        color: #222; }}
 h1 {{ font-size: 1.4rem; }}
 form {{ display: flex; gap: .5rem; margin: 1rem 0; }}
 input[name=question] {{ flex: 1; padding: .5rem; font-size: 1rem; }}
 button {{ padding: .5rem 1rem; }}
 .turn {{ border: 1px solid #ddd; border-radius: 6px; padding: .75rem 1rem; margin: .75rem 0; }}
 .q {{ font-weight: 600; }} .rewrite {{ color: #666; font-size: .9rem; }}
 .answer {{ margin: .5rem 0; }} .sources {{ font-size: .9rem; margin: .25rem 0; }}
 .trace {{ color: #555; font-size: .85rem; }} .error {{ color: #a00; }}
 .htmx-indicator {{ display: none; }} .htmx-request .htmx-indicator {{ display: inline; }}
 .meta {{ color: #777; font-size: .8rem; }}
 .rounds {{ color: #555; font-size: .85rem; margin: .25rem 0; padding: 0; list-style: none; }}
 form.feedback {{ margin: .5rem 0 0; gap: .4rem; align-items: center; font-size: .85rem; }}
 form.feedback input[name=comment] {{ flex: 1; padding: .25rem; font-size: .85rem; }}
 form.feedback button {{ padding: .25rem .6rem; }}
 .recorded {{ color: #060; font-size: .85rem; margin-top: .5rem; }}
</style>
</head>
<body>
<h1>Ask the Cinderwake rulebooks</h1>
<p class="meta">strategy <b>{strategy}</b> · LLM <b>{llm}</b>{ladder}
 · thread <code id="thread-label"></code>
 · <a href="/" id="new-conversation" title="Start a new thread (this one stays at its link)">new
 conversation</a> · <a href="/docs">API</a></p>
<form hx-post="/chat" hx-target="#conversation" hx-swap="beforeend"
      hx-on::after-request="if(event.detail.successful) this.question.value=''">
  <input type="hidden" name="thread_id" id="thread_id">
  <input name="question" placeholder="e.g. What does Arcane Aptitude cost at level 3?"
         maxlength="4000" required autofocus>
{power}  <button type="submit">Ask</button>
  <span class="htmx-indicator">thinking…</span>
</form>
<div id="conversation">{history}</div>
<script>
  // The thread lives in the address (?thread_id=...): a reload shows it again from memory.
  const given = {thread};
  const thread = given || crypto.randomUUID();
  if (!given) {{
    const url = new URL(window.location.href);
    url.searchParams.set("thread_id", thread);
    window.history.replaceState(null, "", url);
  }}
  document.getElementById("thread_id").value = thread;
  document.getElementById("thread-label").textContent = thread;
  // Each question gets a progress id; while it is answered, its rounds are polled and shown.
  const form = document.querySelector("form[hx-post='/chat']");
  form.addEventListener("htmx:configRequest", (e) => {{
    const id = crypto.randomUUID();
    e.detail.parameters["progress_id"] = id;
    const live = document.createElement("div");
    live.className = "turn live";
    live.id = "live-progress";
    live.setAttribute("hx-get", `/chat/progress/${{id}}`);
    live.setAttribute("hx-trigger", "load, every 300ms");
    document.getElementById("conversation").appendChild(live);
    htmx.process(live);
  }});
  form.addEventListener("htmx:afterRequest", () => {{
    const live = document.getElementById("live-progress");
    if (live) live.remove();
  }});
  document.body.addEventListener("htmx:responseError", (e) => {{
    const box = document.createElement("div");
    box.className = "turn error";
    let said = e.detail.xhr.responseText;  // every error is {{"error": "..."}}
    try {{ said = JSON.parse(said).error || said; }} catch (_) {{}}
    box.textContent = `error ${{e.detail.xhr.status}}: ${{said}}`;
    document.getElementById("conversation").appendChild(box);
  }});
</script>
</body>
</html>
"""


def page(
    strategy: str,
    llm: str,
    ladder: list[int] | None = None,
    default_power: PowerChoice = 2,
    thread_id: str | None = None,
    history: Sequence[Turn] = (),
) -> str:
    """The whole chat page; with a depth ladder (adaptive), the ladder and a power control whose
    preselected choice is the server's default. With a thread id, the page continues that
    thread and shows its earlier turns (`history`); without, the browser starts a new one."""
    return PAGE.format(
        thread=json.dumps(thread_id or ""),
        history="".join(past_turn(t) for t in history),
        htmx=HTMX,
        strategy=escape(strategy),
        llm=escape(llm),
        ladder=ladder_note(ladder),
        power=power_control(ladder, default_power),
    )


def ladder_note(ladder: list[int] | None) -> str:
    """The configured ladder, for the page's header."""
    if not ladder:
        return ""
    steps = " / ".join(f"depth {d}: {n}" for d, n in enumerate(ladder, start=1))
    return f' · ladder <b id="ladder">{steps} chunks</b>'


def power_control(ladder: list[int] | None, default_power: PowerChoice) -> str:
    """The power select: auto or a forced depth of the ladder; the default preselected."""
    if not ladder:
        return ""
    choices: list[PowerChoice | int] = ["auto", *range(1, len(ladder) + 1)]
    options = "".join(
        f'<option value="{c}"{" selected" if c == default_power else ""}>'
        f"{power_label(c)}{' — default' if c == default_power else ''}</option>"
        for c in choices
    )
    return (
        '  <label title="auto: the strategy chooses the depth; 1 quick, 2 balanced, 3 deep: '
        'force it">power\n'
        f'    <select name="power">{options}</select></label>\n'
    )


def rounds_view(record: DecisionRecord) -> str:
    """Each adaptive round: depth, chunks, confidence against threshold, decision."""
    items = []
    for r in record.rounds:
        if r.depth is None:
            continue
        confidence = "" if r.confidence is None else f", confidence {r.confidence:.0%}"
        threshold = "" if r.threshold is None else f" (needs {r.threshold:.0%})"
        items.append(
            f"<li>round {r.round}: depth {r.depth}/{record.max_depth}, {r.chunks} chunks"
            f"{confidence}{threshold} → {escape(r.decision)}</li>"
        )
    return f'<ol class="rounds">{"".join(items)}</ol>' if items else ""


def live_rounds(rounds: Sequence[Round] | None, ladder: Sequence[int] | None) -> str:
    """A running turn's rounds so far, for the page to show while it waits: each round's depth
    and confidence against its threshold, and "going deeper…" while it deepens."""
    if not ladder:
        return '<span class="live">searching…</span>'
    if not rounds:
        return '<span class="live">classifying the question and searching…</span>'
    items = []
    for r in rounds:
        confidence = "" if r.confidence is None else f", confidence {r.confidence:.0%}"
        threshold = "" if r.threshold is None else f" (needs {r.threshold:.0%})"
        then = "going deeper…" if r.decision == "increase_depth" else escape(r.decision)
        items.append(
            f"<li>round {r.round}: depth {r.depth}/{len(ladder)}, {r.chunks} chunks"
            f"{confidence}{threshold} → {then}</li>"
        )
    last = rounds[-1].decision
    tail = "" if last == "increase_depth" else "<li>writing the answer…</li>"
    return f'<ol class="rounds live">{"".join(items)}{tail}</ol>'


def feedback_control(request_id: str) -> str:
    """Enough / not enough for one answer, posted by HTMX and replaced by what was recorded."""
    rid = escape(request_id)
    return (
        f'<form class="feedback" hx-post="/chat/feedback" hx-swap="outerHTML">'
        f'<input type="hidden" name="request_id" value="{rid}">'
        "<span>Was this answer enough?</span>"
        '<input name="comment" maxlength="2000" placeholder="what was missing? (optional)" '
        # Enter would submit with the first button ("enough"): the verdict is a button's choice.
        "onkeydown=\"if (event.key === 'Enter') event.preventDefault()\">"
        '<button type="submit" name="enough" value="true">enough</button>'
        '<button type="submit" name="enough" value="false">not enough</button>'
        "</form>"
    )


def feedback_recorded(request_id: str, feedback: Feedback) -> str:
    """What replaces the control once the feedback is stored."""
    said = "enough" if feedback.enough else "not enough"
    comment = f" — “{escape(feedback.comment)}”" if feedback.comment else ""
    return (
        f'<div class="recorded" data-request-id="{escape(request_id)}">'
        f"Feedback recorded: <b>{said}</b>{comment}</div>"
    )


def sources_view(sources: Sequence[Source]) -> str:
    """A turn's sources: book, page, section."""
    items = "".join(
        f"<li>{escape(s.book_title or s.book_id)}, p. {s.page} — {escape(s.section)}</li>"
        for s in sources
    )
    return f'<div class="sources">Sources:<ul>{items or "<li>none</li>"}</ul></div>'


def searched_as(main_question: str) -> str:
    """The standalone question retrieval searched with (a follow-up's rewrite)."""
    return f'<div class="rewrite">searched as: {escape(main_question)}</div>'


def past_turn(kept: Turn) -> str:
    """An earlier turn of the thread, as its memory holds it: question, what it was searched
    as, answer and sources."""
    if kept.answer is None:
        answer = '<div class="trace error">no answer was kept for this question</div>'
    else:
        answer = f'<div class="answer">{escape(kept.answer)}</div>{sources_view(kept.sources)}'
    return (
        f'<div class="turn past"><div class="q">{escape(kept.question)}</div>'
        f"{searched_as(kept.main_question)}{answer}"
        '<div class="meta">earlier turn, from this thread’s memory</div></div>'
    )


def turn(result: AskResult) -> str:
    """One answered turn: question, what it was searched as, answer, sources (book, page), trace
    summary."""
    rewrite = searched_as(result.main_question)
    hops = "; ".join(
        f"hop {h.hop}: {len(h.queries)} quer{'y' if len(h.queries) == 1 else 'ies'}, "
        f"{h.new_documents} new"
        for h in result.hops
    )
    tokens = result.prompt_tokens + result.completion_tokens
    adaptive = ""
    last = result.hops[-1] if result.hops else None
    record = result.decision_log
    if last is not None and last.depth is not None and last.confidence is not None:
        max_depth = record.max_depth if record and record.max_depth else "?"
        power = f" · power {escape(power_label(record.power))}" if record and record.power else ""
        kind = f" · {escape(record.query_type)} question" if record and record.query_type else ""
        adaptive = (
            f'<div class="trace">confidence {last.confidence:.0%} (needs '
            f"{(last.threshold or 0):.0%}) · depth used {last.depth}/{max_depth} · "
            f"{escape(last.adaptive_decision or '')}{power}{kind}</div>"
        )
        if record is not None:
            adaptive += rounds_view(record)
        for note in (last.warning, last.hint):
            if note:
                adaptive += f'<div class="trace error">{escape(note)}</div>'
    if result.limit_note:
        adaptive += f'<div class="trace error">{escape(result.limit_note)}</div>'
    if result.memory_expired:
        adaptive += (
            '<div class="trace error">this conversation sat idle past the memory limit: '
            "it started afresh (earlier turns are forgotten)</div>"
        )
    feedback = feedback_control(result.request_id) if result.request_id else ""

    no_answer = ""
    if result.answer_error:
        no_answer = f'<div class="trace error">no answer: {escape(result.answer_error)}</div>'
    elif result.refused:  # the generator's flag, whatever the refusal says
        no_answer = '<div class="trace">a refusal: the passages found hold no answer</div>'
    answer_class = "answer refused" if result.refused else "answer"
    return (
        '<div class="turn">'
        f'<div class="q">{escape(result.question)}</div>{rewrite}'
        f'<div class="{answer_class}">{escape(result.answer)}</div>'
        f"{no_answer}"
        f"{sources_view(result.sources)}"
        f'<div class="trace">{result.hop_count} hop(s) · {tokens} tokens · '
        f"{result.cost_text} · {result.latency_s:.2f} s · {escape(hops)}</div>"
        f"{adaptive}{feedback}</div>"
    )
