"""The maze image follows the upstream colour rules, pixel by pixel."""

import numpy as np
import pytest
from PIL import Image

from envs.visgym import generate_maze, render_array, render_image
from envs.visgym.render import AGENT_BLUE, GOAL_RED, WALL_GRAY, WHITE


def _check_pixels(img: np.ndarray, maze_map, agent, goal, cs: int) -> None:
    h, w = maze_map.shape
    assert img.shape == (h * cs, w * cs, 3) and img.dtype == np.uint8
    yy, xx = np.mgrid[0:cs, 0:cs]
    centre = cs / 2 - 0.5
    disc = (yy - centre) ** 2 + (xx - centre) ** 2 <= (cs / 4) ** 2
    for r in range(h):
        for c in range(w):
            cell = img[r * cs : (r + 1) * cs, c * cs : (c + 1) * cs]
            if maze_map[r, c] == 1:
                expected = WALL_GRAY
            elif (r, c) == tuple(goal):
                expected = GOAL_RED
            else:
                expected = WHITE
            if (r, c) == tuple(agent):
                assert (cell[disc] == AGENT_BLUE).all(), f"agent disc at {(r, c)}"
                assert (cell[~disc] == expected).all(), f"around the agent at {(r, c)}"
            else:
                assert (cell.reshape(-1, 3) == expected).all(), f"cell {(r, c)} should be {expected}"


@pytest.mark.parametrize("size,side", [(9, 225), (11, 275)])
def test_image_colour_rules(tmp_path, size, side):
    maze_map, start, goal = generate_maze(3, size)
    img = render_image(maze_map, start, goal)
    assert img.mode == "RGB" and img.size == (side, side)
    path = tmp_path / f"maze_{size}.png"
    img.save(path)
    arr = np.asarray(Image.open(path).convert("RGB"))
    _check_pixels(arr, maze_map, start, goal, 25)
    # spot checks in pixel coordinates (x = col, y = row)
    assert tuple(arr[0, 0]) == WALL_GRAY
    cy, cx = start[0] * 25 + 12, start[1] * 25 + 12
    assert tuple(arr[cy, cx]) == AGENT_BLUE
    assert tuple(arr[start[0] * 25 + 1, start[1] * 25 + 1]) == WHITE  # cell corner, off the disc
    assert tuple(arr[goal[0] * 25 + 12, goal[1] * 25 + 12]) == GOAL_RED
    # only the four colours, no grid lines or antialiasing
    colours = {tuple(p) for p in arr.reshape(-1, 3)}
    assert colours == {WHITE, WALL_GRAY, GOAL_RED, AGENT_BLUE}


@pytest.mark.parametrize("cs", [4, 10, 16])
def test_cell_size_and_agent_on_goal(cs):
    maze_map, start, goal = generate_maze(1, 9)
    arr = render_array(maze_map, goal, goal, cell_size=cs)
    assert arr.shape == (9 * cs, 9 * cs, 3)
    _check_pixels(arr, maze_map, goal, goal, cs)  # blue disc over a red cell


@pytest.mark.parametrize("cs", [0, 3, 2.5, True, "25"])
def test_bad_cell_size(cs):
    maze_map, start, goal = generate_maze(1, 9)
    with pytest.raises(ValueError, match="cell_size"):
        render_array(maze_map, start, goal, cell_size=cs)
