"""The recipe extractor of docs/deploy/ (tests/recipes.py): what it takes from a page,
what it refuses, and that every page's markers are well formed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.recipes import DEPLOY, RecipeError, extract, page_recipes, run

PAGE = """\
# A page

Set `DATA_DIR` to an empty directory and `PORT` to a free port.

<!-- recipe: start env: DATA_DIR PORT -->
```sh
echo "$DATA_DIR" "$PORT"
```

Some prose, and a block that is not a recipe:

```sh
rm -rf /
```

<!-- recipe: start -->

```bash
echo second
```

<!-- recipe: other -->
```sh
echo other
```
"""


def test_blocks_of_one_name_join_in_page_order_and_others_are_left_out() -> None:
    recipes = extract(PAGE)
    assert list(recipes) == ["start", "other"]
    assert recipes["start"].env == ("DATA_DIR", "PORT")
    assert recipes["start"].script == 'echo "$DATA_DIR" "$PORT"\necho second'
    assert recipes["other"].env == ()
    assert "rm -rf" not in recipes["start"].script + recipes["other"].script


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("<!-- recipe: a -->\nprose\n```sh\nx\n```\n", "not followed by a sh block"),
        ("<!-- recipe: a -->\n```python\nx\n```\n", "not followed by a sh block"),
        ("<!-- recipe: a -->\n", "not followed by a sh block"),
        ("<!-- recipe: a -->\n```sh\nx\n", "never closed"),
        ("<!-- recipe: Bad -->\n```sh\nx\n```\n", "lower-case-with-dashes"),
        ("<!-- recipe: a uses: X -->\n```sh\nx\n```\n", "only 'env: VAR ...'"),
        ("<!-- recipe: a env: lower -->\n```sh\nx\n```\n", "UPPER_CASE"),
        ("<!-- recipe: a env: -->\n```sh\nx\n```\n", "UPPER_CASE"),
        ("<!-- recipe: a env: SECRET_DIR -->\n```sh\nx\n```\n", "never says what to put"),
        (
            "X and Y.\n<!-- recipe: a env: X -->\n```sh\nx\n```\n"
            "<!-- recipe: a env: Y -->\n```sh\ny\n```\n",
            "another env list",
        ),
    ],
)
def test_a_marker_that_does_not_say_what_to_run_is_refused(text: str, says: str) -> None:
    with pytest.raises(RecipeError, match=says):
        extract(text)


def test_a_variable_named_only_inside_the_recipe_does_not_count_as_documented() -> None:
    text = '<!-- recipe: a env: HIDDEN -->\n```sh\necho "$HIDDEN"\n```\n'
    with pytest.raises(RecipeError, match="HIDDEN"):
        extract(text)


def test_the_runner_gives_exactly_the_declared_placeholders(tmp_path: Path) -> None:
    recipe = extract(PAGE)["start"]
    with pytest.raises(RecipeError, match="declares"):
        run(recipe, {"DATA_DIR": str(tmp_path)}, cwd=tmp_path)
    out = run(recipe, {"DATA_DIR": "/d", "PORT": "1"}, cwd=tmp_path, timeout=30)
    assert out.splitlines() == ["/d 1", "second"]


def test_the_runner_fails_on_an_undeclared_variable_and_on_a_failing_command(
    tmp_path: Path,
) -> None:
    # TOOLQ_REDIS_URL may be set in the test's environment: the recipe must not see it.
    undeclared = extract('<!-- recipe: a -->\n```sh\necho "$TOOLQ_REDIS_URL"\n```\n')["a"]
    with pytest.raises(AssertionError, match="unbound variable"):
        run(undeclared, {}, cwd=tmp_path, timeout=30)
    failing = extract("<!-- recipe: a -->\n```sh\nfalse | cat\necho not reached\n```\n")["a"]
    with pytest.raises(AssertionError, match="exited 1"):
        run(failing, {}, cwd=tmp_path, timeout=30)


@pytest.mark.parametrize("page", sorted(p.name for p in DEPLOY.glob("*.md")))
def test_every_deployment_page_has_well_formed_recipes(page: str) -> None:
    assert page_recipes(page), f"docs/deploy/{page} has no recipe: its commands are not run"
