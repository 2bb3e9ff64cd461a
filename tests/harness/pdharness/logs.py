"""Log capture inside a rank worker: vLLM's (and the shim's) log records, kept for the
parent's result (errors, warnings, the shim's own lines)."""


class LogCapture:
    def __init__(self):
        import logging
        self.records = []
        cap = self

        class H(logging.Handler):
            def emit(self, record):
                # one handler on "vllm" and on the root: a record that propagates from one
                # to the other (vLLM >= 0.33 leaves "vllm" propagating) is kept once
                if getattr(record, "_xlkv_captured", False):
                    return
                record._xlkv_captured = True
                try:
                    msg = record.getMessage()
                except Exception:
                    msg = str(record.msg)
                if record.exc_info and record.exc_info[1] is not None:
                    msg += f" | {type(record.exc_info[1]).__name__}: {record.exc_info[1]}"
                cap.records.append((record.levelname, record.name, msg))

        self.handler = H(level=logging.INFO)
        for name in ("vllm", ""):
            logging.getLogger(name).addHandler(self.handler)
        # vLLM >= 0.33 configures its loggers only when a server or engine applies its
        # LoggingConfig, never at import: the "vllm" logger then inherits the root's WARNING
        # and drops the shim's INFO lines before any handler sees them (xlkv_log was empty).
        vllm_logger = logging.getLogger("vllm")
        if vllm_logger.getEffectiveLevel() > logging.INFO:
            vllm_logger.setLevel(logging.INFO)

    def errors(self):
        return [f"{lvl} {name}: {msg}"[:2000] for lvl, name, msg in self.records
                if lvl in ("ERROR", "CRITICAL")]

    def warnings(self):
        return [f"{lvl} {name}: {msg}"[:600] for lvl, name, msg in self.records
                if lvl == "WARNING"]

    def shim_lines(self, since=0):
        """The shim's own log lines (vLLM's logger tree), whatever vLLM does with stdout; ``since``:
        only records after that many."""
        return [f"{lvl} {msg}"[:400] for lvl, name, msg in self.records[since:]
                if name.startswith("vllm.xlkv_autopatch")][-30:]
