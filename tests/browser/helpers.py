"""What a person does on the chat page, as Playwright calls."""

from __future__ import annotations

from playwright.sync_api import Locator, Page, expect


def open_chat(page: Page, peer: str) -> None:
    page.fill("#peer", peer)
    page.click("#open-chat button")
    expect(page.locator("#title")).to_have_text(peer)


def send(page: Page, body: str) -> None:
    page.fill("#body", body)
    page.press("#body", "Enter")


def bodies(page: Page) -> Locator:
    return page.locator("#messages li .body")
