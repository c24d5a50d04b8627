"""Evaluations on a pool of self-hosted GitHub Actions runners: dispatch, track, collect, verify.

In ``actions`` mode the bot measures nothing itself. It dispatches ``rules.dispatch.workflow`` on
``rules.dispatch.ref`` (trusted main), follows the run, downloads its artifact and believes it only when
the receipt is signed by one of ``rules.dispatch.runner_public_keys``, names the requested PR, head,
base and rules, and its verdict is the one ``verdict.decide`` gives for its measurements. Anything else
is an INFRA_ERROR that never reaches the PR as a verdict; a bad signature or a receipt answering for
something else also raises an alert for a maintainer.

The workflow's contract (what this module relies on):

- ``on: workflow_dispatch`` with string inputs ``pr``, ``head_sha``, ``base_sha``, ``profile``,
  ``request_id`` and ``exclude_runner`` (comma-separated runner names; the job fails at once when
  ``runner.name`` is one of them, so a retry does not land on the box that just failed);
- a ``run-name`` holding the request id as a word of its own, e.g.
  ``run-name: "evalbot #${{ inputs.pr }} ${{ inputs.request_id }}"``: GitHub answers a dispatch with
  the run id only when asked for ``return_run_details`` and able to, and otherwise this is how the bot
  finds its run among the workflow's runs;
- the job runs ``evalbot evaluate --repo . --base BASE --head HEAD --profile P --out out --key KEYFILE``
  and uploads ``out/`` (result.json, receipt.json, report.md at the archive's top level) as the artifact
  ``evalbot-result-<request_id>`` with ``if: always()``: evaluate exits 1 on a REJECT, so a run whose
  conclusion is ``failure`` may still hold a verdict, and its signed receipt decides.

GitHub picks the runner; this module records the one a failed run used (through ``RunnerLookup``, the
run's jobs) and passes it in ``exclude_runner`` on the retry. Handles live in the store
(``store.dispatches``, through ``DispatchRuns``), written before each dispatch, so a restarted poller
picks up its in-flight runs.

Two modules: ``checks`` (pure: the request, the handle, and every check of what a runner sent back) and
``client`` (the GitHub calls, the handles kept in the store, and the poller's entry points).
"""

from __future__ import annotations

from evalbot.dispatch.checks import *  # noqa: F403
from evalbot.dispatch.client import *  # noqa: F403
