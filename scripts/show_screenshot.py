"""Screenshot of an `hp-agent show` page in headless Chromium, one token hovered (docs/algorithm.md's figure).

    python scripts/show_screenshot.py PAGE.html OUT.png [--token N] [--width 1400 --height 900]

Needs Debian's chromium and chromium-driver, and selenium (in the dev extras).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--token", type=int, default=0, help="index of the action token to hover")
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=900)
    args = parser.parse_args()
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", f"--window-size={args.width},{args.height}"):
        options.add_argument(flag)
    browser = webdriver.Chrome(options=options, service=webdriver.ChromeService(shutil.which("chromedriver")))
    try:
        browser.get(args.page.resolve().as_uri())
        token = browser.find_elements(By.CSS_SELECTOR, ".tok")[args.token]
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", token)
        ActionChains(browser).move_to_element(token).click().perform()  # click: keep the panel on it
        browser.save_screenshot(str(args.out))
    finally:
        browser.quit()
    print(f"screenshot written to {args.out}")


if __name__ == "__main__":
    main()
