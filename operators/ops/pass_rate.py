"""`pass_rate`: the task's pass rate, written into each of its experiences' `info` for later curriculum use.

`info.pass_rate` is the share of the task's finished runs whose reward is at least `threshold`, and
`info.pass_rate_runs` how many runs it was measured on (failed runs are missing, not failing). Nothing is
dropped; a later op or the trainer can read it.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from operators.ops.groups import groups_of, set_column
from operators.ops.registry import ExperienceOpBase, register_op
from schemas.experience_ops import PassRateArgs


@register_op("pass_rate")
class PassRate(ExperienceOpBase):
    Args = PassRateArgs

    def __call__(self, experiences: pa.Table) -> pa.Table:
        groups = groups_of(experiences)
        passed = (groups.run_reward.astype(np.float32) >= np.float32(self.args.threshold)).astype(np.float64)
        rate, runs = groups.rows(groups.group_mean(passed)), groups.rows(groups.group_size())
        infos = []
        for i, text in enumerate(experiences.column("info").to_pylist()):
            info = json.loads(text) if text else {}
            info.update(pass_rate=float(rate[i]), pass_rate_runs=int(runs[i]))
            infos.append(json.dumps(info, sort_keys=True))
        return set_column(experiences, "info", pa.array(infos, pa.string()))
