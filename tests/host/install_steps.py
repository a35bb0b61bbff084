"""Install paths of the host checks (tests/check_host.py): the three ways an
operator installs crash-recovery into a real Hermes, each followed by a
journaled call through Hermes' own plugin manager.

1. ``hermes plugins install file://<git repo>`` then ``plugins enable``
   (0.20+: ``hermes plugins doctor --ci`` passes; 0.22+: the host's install
   security scan, without ``--force``, and ``hermes plugins validate``: no
   warning at all with Hermes laid out as its installer's source checkout,
   none naming a Hermes module on a pip-installed Hermes);
2. the checkout copied to ``$HERMES_HOME/plugins`` plus ``plugins.enabled``;
3. ``pip install .`` (entry point and console script).

:class:`InstallSteps` is a mixin of check_host's ``HostRun`` (it uses its
``new_home``, ``add``, ``run_scenario``, ``verify_journal``, ``user_profile``,
``child_environment``, ``hermes`` and ``isolation_prefix``).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import evidence
import source_checkout
from evidence import BOOKING_PLUGIN_DIR, HOST_COMMAND_SECONDS, PLUGIN_NAME, data_dir_of

BOOKING = "booking-service"
# What the 0.22 installer prints when its scan refuses a plugin, and when the
# scan passed but publication failed (both in hermes_cli/plugins_cmd_install.py).
SCAN_REFUSAL = "Decision: BLOCKED"
PUBLICATION_FAILED = "was not published"
# A pip-installed 0.22 publishes every plugin through its package manager,
# whose own runtime (uv and a Python) is downloaded at first use: offline
# (the checks run in a network namespace) that download fails for any plugin.
OFFLINE_RUNTIME_DOWNLOAD = "download failed"


def has_install_scan() -> bool:
    """Whether the host's ``plugins install`` runs the security scan and has
    ``plugins validate`` (0.22+; 0.19 and 0.20 have neither)."""
    return evidence.hermes_release() >= (0, 22, 0)


def has_plugin_doctor() -> bool:
    """Whether the host has ``hermes plugins doctor DIR --ci`` (0.20+)."""
    return evidence.hermes_release() >= (0, 20, 0)


def git_snapshot(directory: Path) -> Path:
    """Make ``directory`` a one-commit git repository (what ``file://`` installs)."""
    environment = dict(os.environ, GIT_AUTHOR_NAME="host-check",
                       GIT_AUTHOR_EMAIL="host-check@localhost", GIT_COMMITTER_NAME="host-check",
                       GIT_COMMITTER_EMAIL="host-check@localhost")
    for words in (["init", "-q", "-b", "main"], ["add", "-A"],
                  ["commit", "-q", "-m", "snapshot of the working tree"]):
        subprocess.run(["git", *words], cwd=str(directory), env=environment, check=True,
                       capture_output=True, timeout=60)
    return directory


PRIVATE_IMPORT_WARNING = "private core imports"


# A plugin that imports one private Hermes module and one third-party
# package: the control that shows which of the two the lint counts as core.
LINT_CONTROL_MANIFEST = ("name: lint-control\nversion: 0.0.1\n"
                         "description: imports a private Hermes module and a third-party package\n")
LINT_CONTROL_SOURCE = ("import fastapi\nfrom hermes_cli.profiles import get_active_profile_name\n\n\n"
                       "def register(ctx):\n    return None\n")
LINT_CONTROL_PRIVATE_IMPORT = "hermes_cli.profiles.get_active_profile_name"


def modules_listed(warning: str) -> list:
    """The modules a private-import warning lists, in order (``rel:line module.name``)."""
    return re.findall(r"\S+\.py:\d+ ([A-Za-z_][\w.]*[A-Za-z0-9_])", warning)


def hermes_modules_named(warning: str) -> list:
    """The modules a private-import warning lists (``rel:line module.name``)
    whose top-level package belongs to the Hermes distribution (the one that
    ships ``hermes_cli``); every module for any other kind of warning."""
    if not warning.startswith(PRIVATE_IMPORT_WARNING):
        return [warning]
    import importlib.metadata
    providers = importlib.metadata.packages_distributions()
    hermes = set(providers.get("hermes_cli", ()))
    modules = modules_listed(warning)
    return [module for module in modules
            if set(providers.get(module.split(".")[0], ())) & hermes or not providers.get(
                module.split(".")[0])]


class InstallSteps:
    """The install-path steps of the host checker's parent process."""

    def validate(self, label: str, home: Path, snapshot: Path) -> None:
        """``hermes plugins validate DIR --json``: every check passes, the
        security scan says safe, and no warning names a Hermes module.

        The one warning allowed is 0.22's private-import lint naming modules of
        *other* distributions: on a pip-installed Hermes (no pyproject.toml
        beside it) the lint counts every top-level package in site-packages as
        Hermes core (``plugin_validate_private_imports._hermes_packages`` falls
        back to ``_hermes_top_level``), so the dashboard routes' own
        ``fastapi``/``starlette`` imports -- the imports Hermes' bundled
        dashboard plugins make too -- are listed.  Any module of the Hermes
        distribution in such a warning, or any other warning, fails.
        :meth:`validate_in_source_checkout` shows the same plugin with no
        warning at all where Hermes is installed as its installer does."""
        passed, found, warnings = self.run_validate(home, snapshot)
        hermes_modules = [module for warning in warnings or []
                          for module in hermes_modules_named(warning)]
        self.add(label, "validate_passes_with_the_security_scan_safe", passed, **found)
        self.add(label, "validate_warns_about_no_hermes_module",
                 isinstance(warnings, list) and len(warnings) <= 1 and hermes_modules == []
                 and all(warning.startswith(PRIVATE_IMPORT_WARNING) for warning in warnings),
                 warnings=warnings, hermes_modules=hermes_modules)

    def run_validate(self, home: Path, plugin: Path, **extra: str) -> tuple:
        """Run ``hermes plugins validate --json PLUGIN`` (``extra``: environment).
        Returns ``(passed, evidence, warnings)``: ``passed`` is exit 0,
        ``ok: true``, no failed check and the security scan ``safe``;
        ``evidence`` holds exit ``code``, ``failed`` checks, ``scan`` and the
        ``output``'s tail; ``warnings`` is the report's list (None when the
        output is not a JSON report)."""
        ran = self.hermes_cli(home, "plugins", "validate", "--json", str(plugin), **extra)
        try:
            report = json.loads(ran.stdout)
        except ValueError:
            report = {}
        failed = [check for check in report.get("checks") or [] if not check.get("ok")]
        scan = [check.get("detail") for check in report.get("checks") or []
                if check.get("name") == "security scan"]
        passed = (ran.returncode == 0 and report.get("ok") is True and failed == []
                  and scan == ["safe"])
        return passed, {"code": ran.returncode, "failed": failed, "scan": scan,
                        "output": (ran.stdout + ran.stderr)[-3000:]}, report.get("warnings")

    def validate_in_source_checkout(self, label: str, home: Path, snapshot: Path) -> None:
        """The same ``hermes plugins validate`` with Hermes laid out as the
        source checkout its installer makes (tests/host/source_checkout.py,
        first on ``PYTHONPATH``; site-packages untouched): exit 0, every check
        passes and there is no warning at all.

        Control, same layout: a plugin importing ``fastapi`` and one private
        Hermes module gets exactly one warning, naming only the Hermes module
        -- the lint is live there and counts Hermes' packages, and only
        those, as core."""
        checkout, _packages, _modules = source_checkout.lay_out_source_checkout(
            home.parent / "hermes-source-checkout")
        passed, found, warnings = self.run_validate(home, snapshot, PYTHONPATH=str(checkout))
        self.add(label, "validate_in_a_source_checkout_passes_with_no_warning",
                 passed and warnings == [], warnings=warnings, **found)
        control = home.parent / "lint-control"
        control.mkdir()
        (control / "plugin.yaml").write_text(LINT_CONTROL_MANIFEST, encoding="utf-8")
        (control / "__init__.py").write_text(LINT_CONTROL_SOURCE, encoding="utf-8")
        _passed, control_found, control_warnings = self.run_validate(
            home, control, PYTHONPATH=str(checkout))
        listed = [modules_listed(warning) for warning in control_warnings or []]
        self.add(label, "source_checkout_lint_names_only_the_hermes_import",
                 control_found["code"] == 0 and listed == [[LINT_CONTROL_PRIVATE_IMPORT]]
                 and control_warnings[0].startswith(PRIVATE_IMPORT_WARNING),
                 warnings=control_warnings, **control_found)

    def publication_needs_network(self, label: str, home: Path) -> None:
        """The install passed the scan but could not be published offline: show
        that a plugin with nothing to scan fails the same way (the host's
        package manager, not this plugin), so the rest of install path 1
        cannot run here."""
        control = home.parent / "control-source"
        shutil.copytree(BOOKING_PLUGIN_DIR, control)
        git_snapshot(control)
        shutil.rmtree(home / "plugins" / BOOKING)
        ran = self.hermes_cli(home, "plugins", "install", f"file://{control}")
        output = ran.stdout + ran.stderr
        self.add(label, "publication_needs_network_for_any_plugin",
                 ran.returncode != 0 and PUBLICATION_FAILED in output
                 and OFFLINE_RUNTIME_DOWNLOAD in output, output=output[-2000:])

    def hermes_cli(self, home: Path, *words: str, **extra: str) -> subprocess.CompletedProcess:
        """The host's program (``hermes``/``hermesx``) with ``words``, in profile
        ``home`` (``extra``: more environment), without network where the
        machine allows it."""
        return subprocess.run(self.isolation_prefix + [self.hermes, *words],
                              env=self.child_environment(home, **extra), capture_output=True,
                              text=True, timeout=HOST_COMMAND_SECONDS, stdin=subprocess.DEVNULL,
                              cwd=str(home.parent))

    def install_git(self) -> None:
        """Install path 1: hermes plugins install file://<git repo>, enable, list.

        The repository is a fresh ``git init`` of the checkout with its
        working-tree changes (:func:`evidence.copy_plugin_checkout`), so what
        the host scans is exactly what would be pushed.  On hosts with the
        install security scan (0.22+) the install runs without ``--force``."""
        label = "install_git"
        home = self.new_home(label)
        snapshot = git_snapshot(evidence.copy_plugin_checkout(home.parent / "clone-source"))
        shutil.copytree(BOOKING_PLUGIN_DIR, home / "plugins" / BOOKING)
        evidence.write_profile(home, enabled=[BOOKING])
        if has_plugin_doctor():
            ran = self.hermes_cli(home, "plugins", "doctor", str(snapshot), "--ci")
            self.add(label, "doctor_ci_passes", ran.returncode == 0,
                     code=ran.returncode, output=(ran.stdout + ran.stderr)[-3000:])
        if has_install_scan():
            self.validate(label, home, snapshot)
            self.validate_in_source_checkout(label, home, snapshot)
        installed = self.hermes_cli(home, "plugins", "install", f"file://{snapshot}")
        output = installed.stdout + installed.stderr
        if has_install_scan():
            # The scan runs before anything is published; a refusal says "BLOCKED".
            self.add(label, "install_scan_passed_without_force",
                     SCAN_REFUSAL not in output and (installed.returncode == 0
                                                     or PUBLICATION_FAILED in output),
                     output=output[-3000:])
            if installed.returncode != 0 and OFFLINE_RUNTIME_DOWNLOAD in output:
                self.publication_needs_network(label, home)
                return
        self.add(label, "install_exit_0", installed.returncode == 0, output=output[-2000:])
        self.add(label, "installed_dir", (home / "plugins" / PLUGIN_NAME / "plugin.yaml").exists())
        enabled = self.hermes_cli(home, "plugins", "enable", PLUGIN_NAME)
        self.add(label, "enable_exit_0", enabled.returncode == 0,
                 output=(enabled.stdout + enabled.stderr)[-2000:])
        listed = self.hermes_cli(home, "plugins", "list", "--json")
        try:
            entries = json.loads(listed.stdout)
        except ValueError:
            entries = []
        mine = [e for e in entries if isinstance(e, dict) and e.get("name") == PLUGIN_NAME]
        self.add(label, "list_json_enabled",
                 len(mine) == 1 and mine[0].get("status") == "enabled"
                 and mine[0].get("source") == "git", listed=listed.stdout[-2000:])
        self.run_scenario(label, "loaded", home, CHECK_EXPECTED_SOURCE="user")
        self.verify_journal(label, home)

    def install_copy(self) -> None:
        """Install path 2: a checkout copied to HERMES_HOME/plugins + plugins.enabled."""
        home = self.user_profile("install_copy")
        self.run_scenario("install_copy", "loaded", home, CHECK_EXPECTED_SOURCE="user")
        self.verify_journal("install_copy", home)

    def install_pip(self) -> None:
        """Install path 3: pip install . registers a hermes_agent.plugins entry point
        naming a module, and the console script runs the operator CLI."""
        label = "install_pip"
        home = self.new_home(label)
        target = home.parent / "site"
        source = evidence.copy_plugin_checkout(home.parent / "pip-source")
        installed = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
             "--disable-pip-version-check", "--target", str(target),
             str(source)],
            capture_output=True, text=True, timeout=300, cwd=str(home.parent))
        self.add(label, "pip_install_exit_0", installed.returncode == 0,
                 output=(installed.stdout + installed.stderr)[-3000:])
        if installed.returncode != 0:
            return
        entry_points = []
        for entry_file in target.glob("*.dist-info/entry_points.txt"):
            entry_points.append(entry_file.read_text(encoding="utf-8"))
        text = "\n".join(entry_points)
        self.add(label, "entry_point_names_module",
                 "[hermes_agent.plugins]" in text and "crash-recovery = crash_recovery\n" in text + "\n",
                 entry_points=text)
        script = target / "bin" / "crash-recovery-operator"
        self.add(label, "console_script_installed", script.exists())
        shutil.copytree(BOOKING_PLUGIN_DIR, home / "plugins" / BOOKING)
        evidence.write_profile(home, enabled=[BOOKING, PLUGIN_NAME])
        self.run_scenario(label, "loaded", home, CHECK_EXPECTED_SOURCE="entrypoint",
                          PYTHONPATH=str(target))
        self.verify_journal(label, home)
        if script.exists():
            # After the scenario journaled a call: the installed operator CLI reads it.
            environment = self.child_environment(home, PYTHONPATH=str(target))
            ran = subprocess.run([sys.executable, str(script), "--data-dir",
                                  str(data_dir_of(home)), "status"], env=environment,
                                 capture_output=True, text=True, timeout=60)
            try:
                document = json.loads(ran.stdout)
            except ValueError:
                document = None
            self.add(label, "console_script_runs",
                     ran.returncode == 0 and isinstance(document, dict)
                     and document.get("integrity") == "ok" and document.get("unresolved") == [],
                     code=ran.returncode, output=(ran.stdout + ran.stderr)[-2000:])
            # The commands it prints name the console script, not an interpreter and a path.
            typo = data_dir_of(home).parent / "crash-recovry"
            ran = subprocess.run([str(script), "--data-dir", str(typo), "status"],
                                 env=environment, capture_output=True, text=True, timeout=60)
            try:
                printed = (json.loads(ran.stdout).get("error") or {}).get("next") or ""
            except ValueError:
                printed = ""
            self.add(label, "console_script_names_itself_in_next",
                     printed == f"{script} --data-dir {data_dir_of(home)} status",
                     printed=printed, output=(ran.stdout + ran.stderr)[-2000:])
