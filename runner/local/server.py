"""Start, check and stop a pinned ComfyUI server that loads the LeanVideo node pack.

Each server gets its own state folder (base, output, temp, log, extra-model-paths file), listens on
loopback unless told otherwise, and passes ``--cpu`` when the machine has no CUDA. Further ComfyUI
flags pass through unchanged, so benchmark variants can add ``--async-offload`` and the like.

Example::

    config = ServerConfig(comfyui_dir=ws.comfyui_dir, state_dir=tmp / "srv", models_dir=ws.models_dir)
    with ComfyServer(config) as server:
        print(server.url)          # http://127.0.0.1:8188, ready to take prompts
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import time
from pathlib import Path
from types import TracebackType

import httpx

from runner.errors import PortInUseError, ServerCrashedError, ServerError, ServerTimeoutError
from runner.local.ports import bind_error
from runner.local.process_group import die_with_parent, terminate_process_group
from runner.local.server_config import (
    MODEL_FOLDERS,
    ServerConfig,
    build_command,
    write_extra_model_paths,
    write_headless_page,
)
from runner.local.server_log import keep_previous_log, missing_package_hint, read_log_tail, start_warnings
from runner.local.server_record import remove_own_record, write_record
from runner.local.state_lock import lock_state_dir, note_holder
from runner.local.workspace import holds_pack

__all__ = [
    "MODEL_FOLDERS",
    "ComfyServer",
    "ServerConfig",
    "build_command",
    "cuda_available",
    "frontend_installed",
    "write_extra_model_paths",
    "write_headless_page",
]

logger = logging.getLogger(__name__)


def cuda_available(python: Path) -> bool:
    """Whether ``python``'s torch sees a CUDA device; cheap ``False`` when no NVIDIA driver is loaded."""
    if not (Path("/dev/nvidiactl").exists() or Path("/proc/driver/nvidia").exists()):
        return False
    probe = subprocess.run(
        [str(python), "-c", "import torch; print(torch.cuda.is_available())"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return probe.stdout.strip() == "True"


def frontend_installed(python: Path) -> bool:
    """Whether ``python`` can import ComfyUI's frontend package (a device kit leaves it out)."""
    probe = "import importlib.util as u, sys; sys.exit(u.find_spec('comfyui_frontend_package') is None)"
    result = subprocess.run([str(python), "-c", probe], capture_output=True, timeout=60, check=False)
    return result.returncode == 0


class ComfyServer:
    """One ComfyUI process: started by :meth:`start`, stopped by :meth:`stop` or the ``with`` block.

    ``detach=True`` lets the server outlive this Python process (``leanvideo serve --background``);
    otherwise the kernel terminates it if we die first.
    """

    def __init__(self, config: ServerConfig, *, detach: bool = False) -> None:
        self.config = config
        self.detach = detach
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return self.config.url

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def log_path(self) -> Path:
        return self.config.log_path

    def start(self) -> None:
        """Launch ComfyUI and block until it answers ``GET /system_stats``.

        Raises:
            PortInUseError: something already listens on the port.
            ServerCrashedError: the process exited during start-up (the message has the log tail).
            ServerTimeoutError: no answer within ``ready_timeout`` (the process is stopped).
        """
        config = self.config
        if self._process is not None:
            raise ServerError(f"server on port {config.port} was already started")
        if (error := bind_error(config.host, config.port)) is not None:
            if error.errno != errno.EADDRINUSE:
                raise ServerError(f"cannot listen on {config.host}:{config.port}: {error.strerror or error}")
            raise PortInUseError(
                f"Port {config.port} on {config.host} is already in use. Stop what listens there "
                f"(`leanvideo stop --port {config.port}` if it is ours) or pass another --port."
            )
        for sub in ("base/custom_nodes", "output"):
            (config.state_dir / sub).mkdir(parents=True, exist_ok=True)
        lock = lock_state_dir(config.state_dir, port=config.port)  # before anything there is touched
        try:
            self._launch(lock)
        finally:
            os.close(lock)  # the server process holds it from here
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        # it runs, without what did not import; and the pack's warnings are in its log only otherwise
        for said in start_warnings(self.log_path, self.config.python, f"ComfyUI on port {self.config.port}"):
            logger.warning("%s", said)
        self._write_record()

    def _launch(self, lock: int) -> None:
        """Start the ComfyUI process, handing it the state folder's ``lock``."""
        config = self.config
        write_extra_model_paths(config)
        cpu = config.cpu if config.cpu is not None else not cuda_available(config.python)
        front_end_root = None
        if not frontend_installed(config.python):
            front_end_root = write_headless_page(config)
            logger.warning("no ComfyUI frontend package for %s: the server runs headless", config.python)
        command = build_command(config, cpu=cpu, front_end_root=front_end_root)
        logger.info("starting ComfyUI: %s", " ".join(command))
        keep_previous_log(config.log_path)
        with config.log_path.open("wb") as log:
            self._process = subprocess.Popen(
                command,
                cwd=config.comfyui_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=None if self.detach else die_with_parent,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                pass_fds=(lock,),
            )
        note_holder(lock, self._process.pid)

    def _wait_ready(self) -> None:
        assert self._process is not None
        started = time.monotonic()
        deadline = started + self.config.ready_timeout
        with httpx.Client(timeout=2.0) as http:
            while True:
                code = self._process.poll()
                if code is not None:
                    tail = read_log_tail(self.log_path)
                    hint = missing_package_hint(tail, self.config.python)
                    raise ServerCrashedError(
                        f"ComfyUI exited with code {code} while starting on port {self.config.port}. "
                        f"Log {self.log_path}, last lines:\n{tail}{hint}"
                    )
                try:
                    if http.get(f"{self.url}/system_stats").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise ServerTimeoutError(
                        f"ComfyUI on port {self.config.port} did not answer /system_stats within "
                        f"{self.config.ready_timeout:g} s. Log {self.log_path}, last lines:\n"
                        f"{read_log_tail(self.log_path)}"
                    )
                time.sleep(0.2)
            pack_expected = any(holds_pack(folder) for folder in self.config.custom_node_dirs)
            info = http.get(f"{self.url}/leanvideo/info") if pack_expected else None
            if info is not None and info.status_code != 200:
                raise ServerError(
                    f"ComfyUI started but the LeanVideo node pack did not load. Log {self.log_path}, "
                    f"last lines:\n{read_log_tail(self.log_path)}"
                )
            answering = info.json().get("pid") if info is not None else None
            if answering is not None and answering != self._process.pid:  # another start won the port
                raise PortInUseError(
                    f"Port {self.config.port} on {self.config.host} was taken by another ComfyUI "
                    f"(pid {answering}) while this one started; choose another --port"
                )
        logger.info("ComfyUI ready at %s after %.1f s", self.url, time.monotonic() - started)

    def _write_record(self) -> None:
        record = {
            "pid": self.pid,
            "port": self.config.port,
            "url": self.url,
            "log": str(self.log_path),
            "comfyui_dir": str(self.config.comfyui_dir),
            "started": time.time(),
            "background": self.detach,  # `leanvideo stop` stops only these: the others have an owner
        }
        write_record(self.config.state_dir, record)

    def wait(self) -> int:
        """Block until the server process exits; returns its exit code."""
        if self._process is None:
            raise ServerError("server was never started")
        return self._process.wait()

    def stop(self) -> int | None:
        """SIGTERM the server's process group, then SIGKILL after ``stop_timeout``; idempotent."""
        process = self._process
        if process is None:
            return None
        code = terminate_process_group(process.pid, self.config.stop_timeout, process.poll, process.wait)
        remove_own_record(self.config.state_dir, process.pid)
        self._process = None
        return code

    def __enter__(self) -> ComfyServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
