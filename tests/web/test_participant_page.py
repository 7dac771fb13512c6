"""The participant's page in a real browser: sign in, open a conversation, send, see the message
accepted at once, the reply stream in and ``Replied``; the edge cuts the stream every few
seconds (its gateway bound), and once the edge is restarted mid-stream; the page resumes after
the last seq it saw: the transcript ends exactly as the API has it, no message twice and none
missing. Then erasure. And the issues
side: follow an issue, see its update arrive in the inbox live, contribute."""

from __future__ import annotations

from typing import Any

import httpx
import jwt
import pytest

from streams.tokens import mint_token
from tests.web.browsers import By, Keys
from tests.web.conftest import (
    WebStack,
    all_by_testid,
    by_testid,
    errors_besides_network,
    fits_360,
    screenshot,
    sign_in,
    token_of,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.web]

FIRST = "The crossing by the school is unsafe. Please add a traffic light."
SECOND = "Also the streetlights on Elm Road have been out for weeks."


def transcript(driver: Any) -> list[tuple[int, str, str]]:
    """(seq, role, text) of every message element in the transcript, in page order."""
    items = by_testid(driver, "transcript").find_elements(By.CSS_SELECTOR, "[data-role]")
    return [(int(li.get_attribute("data-seq")), li.get_attribute("data-role"),
             li.find_element(By.CSS_SELECTOR, ".text").text) for li in items]


def reconnects(driver: Any) -> int:
    return int(by_testid(driver, "stream-status").get_attribute("data-reconnects") or 0)


def requested_with(driver: Any, secret: str) -> list[str]:
    """Every URL the page requested (page, scripts, API calls, streams) that contains
    ``secret``."""
    urls = driver.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)"
        ".concat([location.href])")
    return [u for u in urls if secret in u]


def stream_state(driver: Any) -> str:
    return str(by_testid(driver, "stream-status").get_attribute("data-state"))


def turn_state(driver: Any) -> str:
    return by_testid(driver, "turn-state").text


def agent_replies(driver: Any) -> int:
    return sum(1 for _seq, role, _text in transcript(driver) if role == "agent")


def test_send_reply_replied_and_resume_after_cuts(stack: WebStack, browser: Any) -> None:
    sign_in(browser, stack.url, "/", "alice-web", "participant")
    assert "token" not in browser.current_url  # never in the address bar
    by_testid(browser, "new-conversation").click()
    wait_for(lambda: by_testid(browser, "message-input").is_displayed(), "a conversation open")

    by_testid(browser, "message-input").send_keys(FIRST)
    by_testid(browser, "send-button").click()
    # Accepted at once: the 202 puts the message in the transcript, before any reply.
    first = wait_for(lambda: [m for m in transcript(browser) if m[1] == "participant"],
                     "the sent message in the transcript", timeout=30)
    assert first[0][2] == FIRST
    wait_for(lambda: turn_state(browser) == "Replied" and agent_replies(browser) == 1,
             "the agent's reply and Replied", page=browser)
    assert by_testid(browser, "proposal").is_displayed()

    # The edge cuts every stream at its gateway bound: wait for a cut after the reply.
    seen = reconnects(browser)
    wait_for(lambda: reconnects(browser) > seen, "the stream cut and resumed")
    # Then the edge goes away mid-stream and a new one starts on the same address: the page
    # reconnects by itself. Only the network's own errors may be logged meanwhile.
    stack.restart_edge()
    seen = reconnects(browser)
    wait_for(lambda: reconnects(browser) > seen and stream_state(browser) == "live",
             "the stream resumed on the new edge")
    assert not errors_besides_network(browser)
    # The next message by keyboard alone (Ctrl+Enter in the message box).
    box = by_testid(browser, "message-input")
    box.send_keys(SECOND)
    box.send_keys(Keys.CONTROL, Keys.ENTER)
    wait_for(lambda: agent_replies(browser) == 2 and turn_state(browser) == "Replied",
             "the second reply and Replied", page=browser)
    # And one more cut after it, so a resume after the last event is covered too.
    seen = reconnects(browser)
    wait_for(lambda: reconnects(browser) > seen, "the stream cut and resumed again")

    conversation = by_testid(browser, "transcript").find_element(
        By.XPATH, "ancestor::div[@id='conversation']").find_element(By.ID, "conversation-id").text
    api = httpx.get(f"{stack.url}/me/conversations/{conversation}", timeout=30,
                    headers={"Authorization": f"Bearer {token_of(browser)}"})
    assert api.status_code == 200, api.text
    expected = [(m["seq"], m["role"], m["text"]) for m in api.json()["messages"]]
    shown = transcript(browser)
    assert len({seq for seq, _r, _t in shown}) == len(shown), f"a message shown twice: {shown}"
    assert shown == expected, "the page's transcript differs from the conversation's log"
    assert [role for _s, role, _t in shown] == ["participant", "agent"] * 2
    assert reconnects(browser) >= 2
    assert not requested_with(browser, token_of(browser))
    screenshot(browser, "participant")

    # Readable at 360 px: nothing wider than the window (no sideways scrolling).
    assert fits_360(browser)
    screenshot(browser, "participant-360", width=360)

    # Erase: two steps, then the conversation leaves the list and the API answers 404.
    browser.set_window_size(1280, 900)
    by_testid(browser, "erase-button").click()
    by_testid(browser, "erase-confirm").click()
    wait_for(lambda: not all_by_testid(browser, "transcript")[0].is_displayed(),
             "the conversation closed after erasure")
    wait_for(lambda: conversation not in by_testid(browser, "conversation-list").text,
             "the erased conversation gone from the list")
    gone = httpx.get(f"{stack.url}/me/conversations/{conversation}", timeout=30,
                     headers={"Authorization": f"Bearer {token_of(browser)}"})
    assert gone.status_code == 404


DRAW = ("The bus shelter on Station Road was removed in the spring and never replaced; older "
        "people now wait in the rain. Please put a shelter back.")

PAGE_NOW = """return {
  drafts: [...document.querySelectorAll('li.message.agent.draft .text')].map(e => e.textContent),
  agents: document.querySelectorAll('[data-testid="transcript"] [data-role="agent"]').length,
  state: document.querySelector('[data-testid="turn-state"]').textContent}"""
"""What the page shows of the reply now: the drafts' texts, agent messages, the turn state."""


def test_a_message_answered_after_its_turn_ended_leaves_the_turn_replied(
        stack: WebStack, browser: Any) -> None:
    # Regression: the page set the turn to Thinking when its message's 202 came, even when the
    # stream had already brought the whole turn (a fast turn, a slow answer): stuck "Thinking".
    sign_in(browser, stack.url, "/", "alice-late", "participant")
    by_testid(browser, "new-conversation").click()
    wait_for(lambda: by_testid(browser, "message-input").is_displayed(), "a conversation open")
    browser.execute_script("""
        const real = window.fetch;
        window.fetch = async (...args) => {
          const answer = await real(...args);
          if (String(args[0]).endsWith("/messages")) {  // the 202, held until the turn is done
            await new Promise((done) => {
              const check = () => document.querySelector('[data-testid="turn-state"]')
                .dataset.state === "Replied" ? done() : setTimeout(check, 20);
              check();
            });
          }
          return answer;
        };""")
    by_testid(browser, "message-input").send_keys(FIRST)
    by_testid(browser, "send-button").click()
    wait_for(lambda: browser.execute_script(  # emptied once the 202 is taken
        'return document.querySelector(\'[data-testid="message-input"]\').value') == "",
             "the message's 202 taken, after its turn", timeout=60)
    assert turn_state(browser) == "Replied" and agent_replies(browser) == 1


def test_the_reply_is_drawn_as_it_is_written(slow_stack: WebStack, browser: Any) -> None:
    """With a slow model, a draft of the reply grows in the transcript before the reply is
    recorded; then it is replaced by exactly one agent message, which the draft was the start
    of."""
    sign_in(browser, slow_stack.url, "/", "dora-web", "participant")
    by_testid(browser, "new-conversation").click()
    wait_for(lambda: by_testid(browser, "message-input").is_displayed(), "a conversation open")
    by_testid(browser, "message-input").send_keys(DRAW)
    by_testid(browser, "send-button").click()

    samples: list[dict[str, Any]] = []

    shot: list[Any] = []

    def replied() -> bool:
        now = browser.execute_script(PAGE_NOW)
        samples.append(now)
        if not shot and now["drafts"] and len(now["drafts"][0]) >= 40:
            shot.append(screenshot(browser, "participant-draft"))  # for docs/web.md
        return now["state"] == "Replied" and now["agents"] == 1

    wait_for(replied, "the reply recorded and Replied", page=browser)
    drafting = [s["drafts"][0] for s in samples if s["drafts"] and s["agents"] == 0]
    lengths = sorted({len(d) for d in drafting if d})
    assert len(lengths) >= 2, f"no draft seen growing before the reply: {samples[-5:]}"
    reply = [text for _seq, role, text in transcript(browser) if role == "agent"]
    assert len(reply) == 1, reply
    # Every draft was the start of the reply, and none is left beside it.
    def words(text: str) -> str:
        return " ".join(text.split())

    assert all(words(reply[0]).startswith(words(d)) for d in drafting), (drafting, reply[0])
    assert all(len(s["drafts"]) <= 1 for s in samples)
    assert not browser.execute_script(PAGE_NOW)["drafts"]
    assert [role for _s, role, _t in transcript(browser)] == ["participant", "agent"]


def test_follow_an_issue_see_its_update_live_and_contribute(stack: WebStack, browser: Any) -> None:
    staff = mint_token(stack.settings, "staff-web", "staff", "default", ttl_s=900)
    opened = httpx.post(f"{stack.url}/staff/issues", json={"title": "Potholes on Mill Lane"},
                        headers={"Authorization": f"Bearer {staff}"}, timeout=30)
    assert opened.status_code == 201, opened.text
    issue = opened.json()["issue"]

    # One person per browser: the stack is shared, and the other browser's run left a
    # notification of the same title in its follower's inbox — the check below passed on
    # that one before this run's arrived, and failed when this run's came first.
    sign_in(browser, stack.url, "/", f"bea-web-{browser.name}", "participant")
    browser.find_element(By.ID, "follow-issue").send_keys(issue, Keys.ENTER)
    wait_for(lambda: "Potholes on Mill Lane" in browser.find_element(By.ID, "followed").text,
             "the issue in the followed list")
    # The list is the edge's (GET /me/issues), not this visit's: a reload still shows it.
    browser.refresh()
    wait_for(lambda: "Potholes on Mill Lane" in browser.find_element(By.ID, "followed").text,
             "the followed issue listed after a reload")
    # The inbox stream is already open: the development arrives without a reload.
    developed = httpx.post(f"{stack.url}/staff/issues/{issue}/developments",
                           json={"title": "Repairs scheduled", "body": "Crews start Monday."},
                           headers={"Authorization": f"Bearer {staff}"}, timeout=30)
    assert developed.status_code == 202, developed.text
    wait_for(lambda: "Repairs scheduled" in by_testid(browser, "inbox").text,
             "the update in the inbox")
    assert len(all_by_testid(browser, "notification")) == 1

    browser.find_element(By.ID, "contribute-issue").send_keys(issue)
    browser.find_element(By.ID, "contribute-text").send_keys("The hole by number 12 is deep.")
    browser.find_element(By.CSS_SELECTOR, "#contribute-form button[type=submit]").click()
    wait_for(lambda: "is in review" in browser.find_element(By.ID, "contribute-status").text,
             "the contribution accepted")

    browser.find_element(By.CSS_SELECTOR, f'#followed li[data-issue="{issue}"] button').click()
    wait_for(lambda: "You follow no issue yet" in browser.find_element(By.ID, "followed").text,
             "the issue no longer followed")


def test_a_refused_token_is_explained_in_words(stack: WebStack, browser: Any) -> None:
    """A token the edge refuses (here: signed with another secret) arrives in the fragment: the
    page says so in words and offers to sign in again; the token was in no URL requested."""
    forged = jwt.encode({"sub": "mallory", "role": "participant"}, "not-the-secret" * 4,
                        algorithm="HS256")
    browser.get(f"{stack.url}/#token={forged}")
    error = wait_for(lambda: browser.find_element(By.ID, "list-error").text,
                     "the refusal shown")
    assert "not signed in, or your sign-in has expired" in error
    assert browser.find_element(By.XPATH, "//button[text()='Sign in again']").is_displayed()
    assert "#token" not in browser.current_url
    assert not requested_with(browser, forged)
    # Chromium logs each 401 answer itself ("Failed to load resource"): those are expected.
    others = [e for e in browser.errors() if "status of 401" not in e]
    assert not others
    browser.find_element(By.XPATH, "//button[text()='Sign in again']").click()
    wait_for(lambda: all_by_testid(browser, "dev-signin"), "the sign-in form again")


def test_the_list_shows_the_newest_page_and_older_conversations_on_request(
        stack: WebStack, browser: Any) -> None:
    """A participant with more conversations than a page: the newest page, then the older ones
    on a click, above them — the whole list in the order the API has it, each once."""
    import uuid

    sub = f"many-{uuid.uuid4().hex[:8]}"
    auth = {"Authorization": f"Bearer {mint_token(stack.settings, sub, 'participant')}"}
    with httpx.Client(base_url=stack.url, headers=auth, timeout=30) as client:
        made = [client.post("/me/conversations").json()["conversation"] for _ in range(103)]
    sign_in(browser, stack.url, "/", sub, "participant")

    def shown() -> list[str]:
        return [li.get_attribute("data-conversation") for li in
                by_testid(browser, "conversation-list").find_elements(By.CSS_SELECTOR, "li")]

    wait_for(lambda: len(shown()) == 100, "the newest page of conversations")
    assert shown() == made[3:]
    older = by_testid(browser, "older-conversations")
    assert older.is_displayed()
    older.click()
    wait_for(lambda: len(shown()) == 103, "the older conversations")
    assert shown() == made
    assert not by_testid(browser, "older-conversations").is_displayed()
    assert not browser.errors()
