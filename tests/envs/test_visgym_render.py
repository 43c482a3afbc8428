"""The maze image follows the upstream colour rules, pixel by pixel; the agent disc is pygame's."""

import numpy as np
import pytest
from PIL import Image

from envs.visgym import generate_maze, render_array, render_image
from envs.visgym.render import AGENT_BLUE, GOAL_RED, WALL_GRAY, WHITE, agent_disc_mask
from tests.envs.pygame_reference import PygameCanvas, pygame_frame


def _pygame_disc(cs: int) -> np.ndarray:
    """pygame's filled circle in one cell, drawn as upstream draws the agent (bool [cs, cs])."""
    blank = np.zeros((3, 3), dtype=np.int64)
    frame = PygameCanvas(blank, (0, 0), cs).draw((1, 1)).array()
    return (frame[cs : 2 * cs, cs : 2 * cs] == AGENT_BLUE).all(axis=-1)


def _check_pixels(img: np.ndarray, maze_map, agent, goal, cs: int) -> None:
    h, w = maze_map.shape
    assert img.shape == (h * cs, w * cs, 3) and img.dtype == np.uint8
    disc = _pygame_disc(cs)
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


def test_disc_at_25_px_is_upstreams_104_pixels():
    """The issue's numbers: upstream's disc in a 25 px cell covers 104 pixels, rows and columns 6..17."""
    disc = agent_disc_mask(25)
    rows, cols = np.nonzero(disc)
    assert disc.sum() == 104
    assert (rows.min(), rows.max(), cols.min(), cols.max()) == (6, 17, 6, 17)
    assert (disc == _pygame_disc(25)).all()


# Every cell size from the smallest allowed (4) to 64, then larger ones, odd and even.
CELL_SIZES = list(range(4, 65)) + [75, 99, 100, 128, 201]


@pytest.mark.parametrize("cs", CELL_SIZES)
def test_disc_mask_equals_pygame(cs):
    assert (agent_disc_mask(cs) == _pygame_disc(cs)).all(), f"cell size {cs}"


@pytest.mark.parametrize("cs", [4, 5, 7, 12, 25, 26, 33, 40])
@pytest.mark.parametrize("seed", [0, 5])
def test_frame_equals_pygame_drawing(cs, seed):
    """Whole frames, agent on its start, on the goal and elsewhere, against pygame drawing upstream's
    draw calls on a fresh canvas."""
    maze_map, start, goal = generate_maze(seed, 11)
    free = [tuple(p) for p in np.argwhere(maze_map == 0)]
    for agent in (start, goal, free[len(free) // 2]):
        ours = render_array(maze_map, agent, goal, cell_size=cs)
        ref = pygame_frame(maze_map, agent, goal, cs)
        diff = np.argwhere((ours != ref).any(axis=-1))
        assert len(diff) == 0, f"cs={cs} agent={agent}: {len(diff)} pixels differ, first {diff[:3].tolist()}"


def test_disc_mask_is_cached_read_only():
    assert agent_disc_mask(25) is agent_disc_mask(25)
    with pytest.raises(ValueError):
        agent_disc_mask(25)[0, 0] = True
