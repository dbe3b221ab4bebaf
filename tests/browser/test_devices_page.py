"""The push devices a user has registered (GET /v1/devices), as the page lists them: registered
through the API, as an app does (the page registers none: docs/web-client.md)."""

from __future__ import annotations

import httpx
from playwright.sync_api import Page, expect

from harness.system import System
from tests.timing import PATIENCE


def devices_api(system: System, user: str, method: str, path: str = "/v1/devices", **kwargs) -> httpx.Response:
    return httpx.request(method, f"{system.api_url}{path}", headers={"Authorization": f"Bearer {system.token(user)}"},
                         timeout=PATIENCE, **kwargs)


def register(system: System, user: str, device: str, platform: str, app_id: str) -> None:
    reply = devices_api(system, user, "POST", json={"device": device, "platform": platform, "app_id": app_id,
                                                    "pushkey": f"pk-{device}"})
    assert reply.status_code == 201, reply.text


def listed(page: Page):
    return page.locator("#devices li")


def test_the_page_lists_the_users_push_devices(web, open_page, users):
    alice, bob = users("alice"), users("bob")
    register(web, bob, "phone-1", "android", "chat.example")

    b, a = open_page(web, bob), open_page(web, alice)
    expect(listed(b)).to_have_text(["phone-1 android · chat.example"])
    expect(b.locator("#devices li[data-device='phone-1'] .device")).to_have_text("phone-1")
    expect(b.locator("#devices-note")).to_have_text("")
    expect(listed(a)).to_have_count(0)  # bob's are bob's
    expect(a.locator("#devices-note")).to_have_text("none registered")

    register(web, bob, "laptop", "web", "chat.web")  # from another app of bob's, while the page is open
    b.click("#devices-refresh")
    expect(listed(b)).to_have_text(["phone-1 android · chat.example", "laptop web · chat.web"])

    assert devices_api(web, bob, "DELETE", "/v1/devices/phone-1").status_code == 204
    b.click("#devices-refresh")
    expect(listed(b)).to_have_text(["laptop web · chat.web"])

    b.click("#logout")  # another user of this browser sees none of them
    expect(listed(b)).to_have_count(0)
