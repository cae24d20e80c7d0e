"""Start and stop our own Kamailio (configs/kamailio.cfg) on a loopback port."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path

from sip.aio.ua import UaConfig, UserAgent
from sip.transaction import TimerConfig
from tests.peers import free_port, missing, require_binary
from tests.sip.certs import Certs

CONFIG = Path(__file__).resolve().parents[3] / "configs" / "kamailio.cfg"
# Debian's kamailio-tls-modules (the multiarch folder differs per architecture).
TLS_MODULES = "*/kamailio/modules/tls.so"


def tls_config(certs: Certs) -> str:
    """Kamailio's tls.cfg: our certificate as a server; as a client (towards the broker)
    verify the peer against our CA. The same file as in docs/operations.md §9."""
    return (
        "[server:default]\nmethod = TLSv1.2+\nverify_certificate = no\n"
        f"require_certificate = no\nprivate_key = {certs.key}\ncertificate = {certs.cert}\n\n"
        "[client:default]\nmethod = TLSv1.2+\nverify_certificate = yes\n"
        f"require_certificate = yes\nca_list = {certs.ca}\n"
    )


class Kamailio:
    """``kamailio -DD`` in its own session; stopped by signalling that session (ours).
    ``dispatcher``: a dispatcher list file, for the config's ``WITH_DISPATCHER`` mode
    (several brokers behind it)."""

    def __init__(
        self,
        workdir: Path,
        children: int = 2,
        tls: Certs | None = None,
        shm_mb: int = 64,
        dispatcher: Path | None = None,
    ) -> None:
        binary = require_binary("kamailio", "apt-get install kamailio")
        self.port = free_port()
        self.addr = ("127.0.0.1", self.port)
        self.tls_addr: tuple[str, int] | None = None
        rundir = workdir / "kamailio-run"
        rundir.mkdir(exist_ok=True)
        extra: list[str] = []
        if tls is not None:
            # The TLS module is a separate Debian package; the stock config loads it
            # only with -A WITH_TLS, with the tls.cfg of docs/operations.md §9.
            if not any(Path("/usr/lib").glob(TLS_MODULES)):
                missing("kamailio TLS module", "apt-get install kamailio-tls-modules")
            self.tls_addr = ("127.0.0.1", free_port())
            tls_cfg = workdir / "kamailio-tls.cfg"
            tls_cfg.write_text(tls_config(tls))
            extra = [
                "-A", "WITH_TLS", "-A", f'TLS_CONFIG="{tls_cfg}"',
                "-l", f"tls:127.0.0.1:{self.tls_addr[1]}",
            ]  # fmt: skip
        if dispatcher is not None:
            extra += ["-A", "WITH_DISPATCHER", "-A", f'DISPATCHER_LIST="{dispatcher}"']
        self.log = workdir / "kamailio.log"
        self._log = self.log.open("w")
        self.process = subprocess.Popen(
            [
                binary, "-f", str(CONFIG), "-DD", "-E",
                "-l", f"udp:127.0.0.1:{self.port}", "-l", f"tcp:127.0.0.1:{self.port}",
                "-Y", str(rundir), "-m", str(shm_mb), "-M", "8", "-n", str(children), *extra,
            ],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    async def ready(self, timeout: float = 15.0) -> None:
        """Wait until Kamailio answers an OPTIONS (any final response will do)."""
        ua = UserAgent(UaConfig(aor="sip:probe@example.org", timers=TimerConfig(t1=0.05)))
        await ua.start("127.0.0.1")
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while loop.time() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"kamailio exited: {self.log.read_text()[-2000:]}")
                request = ua.build_request(
                    "OPTIONS", f"sip:127.0.0.1:{self.port}", to=f"<sip:127.0.0.1:{self.port}>"
                )
                response = await ua.request(request, self.addr)
                if response.status != 408:
                    return
            raise RuntimeError(f"kamailio did not answer: {self.log.read_text()[-2000:]}")
        finally:
            await ua.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)  # our own session, by its leader's PID
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)
        self._log.close()
