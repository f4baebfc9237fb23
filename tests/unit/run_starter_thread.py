"""A preload that leaves a thread running: the run starter must then refuse to fork."""

import threading
import time

threading.Thread(target=time.sleep, args=(3600,), name="left-running", daemon=True).start()
