"""Re-record the histories in this folder (run by hand: `.venv/bin/python tests/histories/record.py`).

Starts a local broker, the simulator and a worker, plays three test conversations, and exports
each turn with `deploy.histories.export_history`. The keys in these files open only these test
conversations."""
import asyncio
import sys
import tempfile
import time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from deploy.kafka_local import LocalKafka, free_port
from deploy.processes import spawn_voice, stop, wait_group_stable, wait_http_ready, worker_group
from deploy.histories import export_history
from streams.settings import VoiceSettings
from streams.topics import create_topics, topic_name, COMMANDS, CONVERSATIONS
from streams.producer import RecordProducer
from streams.envelope import Envelope, decode
from streams.reading import read_topic
from streams.sealing import sealer_for
from schemas.conversation import StartConversation, SendMessage

tmp = Path(tempfile.mkdtemp())
k = LocalKafka(data_dir=tmp / "k", port=free_port()); k.start()
s = VoiceSettings(kafka_bootstrap=k.bootstrap, topic_prefix="h.", group_prefix="h", state_dir=tmp, env="test", topic_partitions=3)
create_topics(s)
sp = free_port()
sim = spawn_voice(s, "simulator", "--port", str(sp), log=tmp / "sim.log")
wait_http_ready(f"http://127.0.0.1:{sp}/health", proc=sim)
w = spawn_voice(s, "worker", log=tmp / "w.log", ANTHROPIC_API_KEY="simulator", ANTHROPIC_BASE_URL=f"http://127.0.0.1:{sp}")
wait_group_stable(s, worker_group(s))
sealer = sealer_for(s)

def send(*envs):
    async def go():
        p = RecordProducer(s)
        for e in envs: await p.send(topic_name(s, COMMANDS), e)
        p.close()
    asyncio.run(go())

def wait_turn(cnv, seq):
    for _ in range(300):
        for m in read_topic(s, topic_name(s, CONVERSATIONS), key=cnv.encode()):
            e = decode(m.key(), m.value(), m.headers())
            if e.type == "voice.conversation.turn_state_changed.v1" and e.record.turn == f"{cnv}:turn-{seq}" and e.record.state != "Thinking":
                return
        time.sleep(0.2)
    raise SystemExit("no reply")

out = Path(__file__).resolve().parent
def msg(cnv, mid, text): return Envelope(record=SendMessage(conversation=cnv, message_id=mid, text=sealer.seal(cnv, mid, text)), key=cnv, source="/history")
a = "cnv-a1a1a1a1a1a1a1a1"
send(Envelope(record=StartConversation(conversation=a, owner="alice"), key=a, source="/history"),
     msg(a, "m1", "I am worried the crossing by the school is unsafe. Please add a traffic light."))
wait_turn(a, 2); export_history(s, f"{a}:turn-2", out / "01_concern_with_proposal.json")
last = max(decode(m.key(), m.value(), m.headers()).seq for m in read_topic(s, topic_name(s, CONVERSATIONS), key=a.encode()))
send(msg(a, "m2", "Also the pavement is broken and dangerous for wheelchairs. We need it fixed."))
wait_turn(a, last + 1)
export_history(s, f"{a}:turn-{last + 1}", out / "02_second_turn_with_history.json")
b = "cnv-b2b2b2b2b2b2b2b2"
send(Envelope(record=StartConversation(conversation=b, owner="bob"), key=b, source="/history"), msg(b, "m1", "asdf"))
wait_turn(b, 2); export_history(s, f"{b}:turn-2", out / "03_could_not_interpret.json")
stop(w); stop(sim); k.stop()
print("ok")
