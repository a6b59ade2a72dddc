"""Browser tests (headless chromium through Playwright).

The page runs under the farm's Content-Security-Policy, which allows no `eval`: Playwright's
`wait_for_function` evaluates its predicate in the page with `eval`, so the policy refuses it.
`wait_js` asks the same question from outside instead (`page.evaluate` goes through the
DevTools protocol, which the policy does not govern), so the page itself still runs under the
policy it is served with and any violation is a console error the tests catch."""

from __future__ import annotations

from tests.helpers import wait_until


def wait_js(page, expression: str, timeout_s: float = 60.0):
    """Evaluate `expression` in `page` until it is truthy, and return it; fail past
    `timeout_s` (written for an idle box, stretched with its load like every wait)."""
    return wait_until(lambda: page.evaluate(expression), timeout_s,
                      f"the page never had {expression}", interval_s=0.1)
