"""The chat page and its HTML fragments (rendered with escaping; HTMX does the requests)."""

from __future__ import annotations

from html import escape

from caprag.services import AskResult

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
</style>
</head>
<body>
<h1>Ask the Cinderwake rulebooks</h1>
<p class="meta">strategy <b>{strategy}</b> · LLM <b>{llm}</b>
 · thread <code id="thread-label"></code> · <a href="/docs">API</a></p>
<form hx-post="/chat" hx-target="#conversation" hx-swap="beforeend"
      hx-on::after-request="if(event.detail.successful) this.question.value=''">
  <input type="hidden" name="thread_id" id="thread_id">
  <input name="question" placeholder="e.g. What does Arcane Aptitude cost at level 3?"
         maxlength="4000" required autofocus>
  <label title="adaptive strategy only: force the search depth">power
    <select name="power"><option>auto</option><option>1</option><option>2</option>
    <option>3</option></select></label>
  <button type="submit">Ask</button>
  <span class="htmx-indicator">thinking…</span>
</form>
<div id="conversation"></div>
<script>
  const thread = crypto.randomUUID();
  document.getElementById("thread_id").value = thread;
  document.getElementById("thread-label").textContent = thread;
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


def page(strategy: str, llm: str) -> str:
    """The whole chat page."""
    return PAGE.format(htmx=HTMX, strategy=escape(strategy), llm=escape(llm))


def turn(result: AskResult) -> str:
    """One answered turn: answer, sources (book, page), trace summary."""
    rewrite = ""
    if result.main_question != result.question:
        rewrite = f'<div class="rewrite">searched as: {escape(result.main_question)}</div>'
    sources = (
        "".join(
            f"<li>{escape(s.book_title or s.book_id)}, p. {s.page} — {escape(s.section)}</li>"
            for s in result.sources
        )
        or "<li>none</li>"
    )
    hops = "; ".join(
        f"hop {h.hop}: {len(h.queries)} quer{'y' if len(h.queries) == 1 else 'ies'}, "
        f"{h.new_documents} new"
        for h in result.hops
    )
    tokens = result.prompt_tokens + result.completion_tokens
    adaptive = ""
    last = result.hops[-1] if result.hops else None
    if last is not None and last.depth is not None and last.confidence is not None:
        adaptive = (
            f'<div class="trace">confidence {last.confidence:.0%} (needs '
            f"{(last.threshold or 0):.0%}) · depth used {last.depth}/3 · "
            f"{escape(last.adaptive_decision or '')}</div>"
        )
        for note in (last.warning, last.hint):
            if note:
                adaptive += f'<div class="trace error">{escape(note)}</div>'

    no_answer = ""
    if result.answer_error:
        no_answer = f'<div class="trace error">no answer: {escape(result.answer_error)}</div>'
    return (
        '<div class="turn">'
        f'<div class="q">{escape(result.question)}</div>{rewrite}'
        f'<div class="answer">{escape(result.answer)}</div>'
        f"{no_answer}"
        f'<div class="sources">Sources:<ul>{sources}</ul></div>'
        f'<div class="trace">{result.hop_count} hop(s) · {tokens} tokens · '
        f"${result.cost_usd:.6f} · {result.latency_s:.2f} s · {escape(hops)}</div>"
        f"{adaptive}</div>"
    )
