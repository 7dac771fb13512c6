"""The assistant's page in a real browser: the seed's example end to end — upload the facilities
CSV, ask "Show me RCRA facilities in Louisiana on a map", watch the thinking channel and the
text, and get a map card drawn locally with exactly the Louisiana points (none of the others)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import pytest

from tests.web.browsers import By
from tests.web.conftest import (
    WebStack,
    all_by_testid,
    by_testid,
    fits_360,
    screenshot,
    sign_in,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.web]

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "assistant_facilities.csv"
MAP_ASK = "Show me RCRA facilities in Louisiana on a map"


def louisiana() -> set[tuple[str, float, float]]:
    """(name, lat, lon) of every row of the fixture in LA: what the map must show, exactly."""
    rows = csv.DictReader(io.StringIO(FIXTURE.read_text()))
    return {(r["name"], float(r["lat"]), float(r["lon"])) for r in rows if r["state"] == "LA"}


def test_louisiana_map_example(stack: WebStack, browser: Any) -> None:
    sign_in(browser, stack.url, "/assistant", "ana-web", "participant")
    by_testid(browser, "upload-input").send_keys(str(FIXTURE))
    wait_for(lambda: "12 rows" in by_testid(browser, "datasets").text, "the CSV uploaded")

    by_testid(browser, "message-input").send_keys(MAP_ASK)
    by_testid(browser, "send-button").click()
    card = wait_for(lambda: all_by_testid(browser, "map-card"), "the map card")[0]
    wait_for(lambda: by_testid(browser, "turn-state").text == "Replied", "the turn Replied")

    shown = {(p.get_attribute("data-label"), float(p.get_attribute("data-lat")),
              float(p.get_attribute("data-lon")))
             for p in card.find_elements(By.CSS_SELECTOR, '[data-testid="map-point"]')}
    assert len(card.find_elements(By.CSS_SELECTOR, '[data-testid="map-point"]')) == 4
    assert shown == louisiana()

    transcript = by_testid(browser, "transcript")
    assert [li.get_attribute("data-role")
            for li in transcript.find_elements(By.CSS_SELECTOR, "[data-role]")] == [
        "participant", "agent"]
    assert "Louisiana" in transcript.find_element(
        By.CSS_SELECTOR, '[data-role="agent"] .text').text
    # The thinking channel: collapsed, and it lists the tool calls in order.
    thinking = by_testid(browser, "thinking")
    assert thinking.get_attribute("open") is None
    tools = [li.get_attribute("data-tool")
             for li in thinking.find_elements(By.CSS_SELECTOR, "li[data-tool]")]
    assert tools == ["describe_dataset", "query_dataset", "display_map"]
    screenshot(browser, "assistant")
    thinking.find_element(By.TAG_NAME, "summary").click()  # opens by mouse (and keyboard)
    assert thinking.get_attribute("open") is not None
    assert fits_360(browser)


def test_cancel_a_running_turn(slow_stack: WebStack, browser: Any) -> None:
    """With a slow model the turn is still running when the page's cancel is pressed: the turn
    stops before its map, and the page says it was cancelled."""
    sign_in(browser, slow_stack.url, "/assistant", "carl-web", "participant")
    by_testid(browser, "upload-input").send_keys(str(FIXTURE))
    wait_for(lambda: "12 rows" in by_testid(browser, "datasets").text, "the CSV uploaded")
    by_testid(browser, "message-input").send_keys(MAP_ASK)
    by_testid(browser, "send-button").click()

    cancel = wait_for(lambda: by_testid(browser, "cancel-button").is_displayed()
                      and by_testid(browser, "cancel-button"), "the cancel button shown")
    assert by_testid(browser, "turn-state").text == "Thinking"
    cancel.click()
    wait_for(lambda: by_testid(browser, "turn-state").text == "Cancelled",
             "the turn shown Cancelled")
    assert not by_testid(browser, "cancel-button").is_displayed()
    assert by_testid(browser, "send-button").is_enabled()
    assert not all_by_testid(browser, "map-card"), "the turn ran on to its map"
    screenshot(browser, "assistant-cancelled")
