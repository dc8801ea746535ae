"""CPU per ZeroMQ round trip between two processes over a Unix socket (PAIR, 20-byte
messages, each side polling as the graph's processes do), all threads counted: what one
message costs on this VM. ``python benchmarks/results/hams-profile/zmq_round_trip.py``."""
import zmq, os, time, multiprocessing as mp, resource
ADDR = f"ipc:///tmp/zmq-round-trip-{os.getpid()}.sock"
N = 5000
def echo():
    ctx = zmq.Context(); s = ctx.socket(zmq.PAIR); s.connect(ADDR)
    p = zmq.Poller(); p.register(s, zmq.POLLIN)
    t0 = time.process_time()
    for i in range(N):
        p.poll(1000); m = s.recv_multipart(copy=False); s.send_multipart([b"x"*20])
    print("echo cpu per round trip us", 1e6*(time.process_time()-t0)/N)
if __name__ == "__main__":
    ctx = zmq.Context(); r = ctx.socket(zmq.PAIR); r.bind(ADDR)
    pr = mp.Process(target=echo); pr.start()
    p = zmq.Poller(); p.register(r, zmq.POLLIN)
    t0 = time.process_time(); w0 = time.perf_counter()
    for i in range(N):
        r.send_multipart([b"y"*20]); p.poll(1000); r.recv_multipart(copy=False)
    w = time.perf_counter()-w0
    print("sender cpu per round trip us", 1e6*(time.process_time()-t0)/N, "wall us", 1e6*w/N)
    pr.join()
