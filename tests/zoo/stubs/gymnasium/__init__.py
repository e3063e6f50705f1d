"""A local stand-in for ``gymnasium`` (not installed here, and nothing is downloaded): the one environment the
zoo's actor-critic script makes, ``CartPole-v1``, with the classic cart-pole dynamics (Barto, Sutton and
Anderson, 1983; the equations and limits gymnasium uses) and its API: ``make``, ``reset(seed=)`` ->
``(state, info)``, ``step(action)`` -> ``(state, reward, terminated, truncated, info)``, ``spec.reward_threshold``.

Only for tests: the reward threshold (gymnasium's 475) comes from ``GYM_STUB_REWARD_THRESHOLD`` when set, so
that the script, which trains until its running reward passes it, stops after a few episodes."""

from __future__ import annotations

import math
import os
from types import SimpleNamespace
from typing import Any

import numpy as np

__all__ = ["make"]


class CartPoleEnv:
    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    theta_limit, x_limit, max_steps = 12 * 2 * math.pi / 360, 2.4, 500

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode
        self.spec = SimpleNamespace(id="CartPole-v1",
                                    reward_threshold=float(os.environ.get("GYM_STUB_REWARD_THRESHOLD", "475")))
        self._rng = np.random.default_rng()
        self.state = np.zeros(4)
        self.steps = 0

    def reset(self, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict[str, Any]]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.state = self._rng.uniform(-0.05, 0.05, size=4)
        self.steps = 0
        return self.state.astype(np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        x, x_dot, theta, theta_dot = self.state
        force = self.force_mag if action == 1 else -self.force_mag
        total = self.masspole + self.masscart
        pml = self.masspole * self.length
        cos, sin = math.cos(theta), math.sin(theta)
        temp = (force + pml * theta_dot**2 * sin) / total
        theta_acc = (self.gravity * sin - cos * temp) / (self.length * (4.0 / 3.0 - self.masspole * cos**2 / total))
        x_acc = temp - pml * theta_acc * cos / total
        x, x_dot = x + self.tau * x_dot, x_dot + self.tau * x_acc
        theta, theta_dot = theta + self.tau * theta_dot, theta_dot + self.tau * theta_acc
        self.state = np.array([x, x_dot, theta, theta_dot])
        self.steps += 1
        terminated = bool(abs(x) > self.x_limit or abs(theta) > self.theta_limit)
        return self.state.astype(np.float32), 1.0, terminated, self.steps >= self.max_steps, {}


def make(env_id: str, render_mode: str | None = None, **kwargs: Any) -> CartPoleEnv:
    if env_id != "CartPole-v1":
        raise ValueError(f"this stand-in only makes CartPole-v1, not {env_id}")
    return CartPoleEnv(render_mode)
