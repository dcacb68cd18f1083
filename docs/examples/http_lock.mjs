// Take a fencelock lock over HTTP, keep its lease alive while working, release it.
//
// Node 18 or later (fetch), nothing to install. Usage:
//
//     FENCELOCK_HTTP=http://127.0.0.1:7071 node http_lock.mjs LOCK [SECONDS]
//
// Prints one JSON line per step. The keep-alive runs every third of the TTL;
// if it ever answers 404 (the lease ended: a pause past the TTL, a cut
// network) the work must stop, because another process may hold the lock now.
// Ids and tokens are decimal strings: JSON numbers would lose their low digits
// in JavaScript, so pass them on as they are.

const BASE = process.env.FENCELOCK_HTTP ?? "http://127.0.0.1:7071";
const TTL_MS = 3000;

// One request; [status, JSON answer]. Refusals are JSON too: {"error": {"code", "message"}}.
async function call(method, path, body) {
  const r = await fetch(BASE + path, {
    method,
    headers: { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return [r.status, await r.json()];
}

const say = (fields) => console.log(JSON.stringify(fields));
const sleep = (ms) => new Promise((done) => setTimeout(done, ms));

const lock = process.argv[2];
const path = `/v1/locks/${encodeURIComponent(lock)}`; // a "/" in a name is %2F
const seconds = Number(process.argv[3] ?? "2");
// One call: a new lease, and the lock on it, waiting up to a minute in the queue.
const [status, grant] = await call("POST", `${path}/acquire`, { ttl_ms: TTL_MS, wait_ms: 60000 });
if (status !== 200) {
  say({ step: "refused", status, error: grant.error });
  process.exit(1);
}
const { lease_id: lease, token } = grant;
say({ step: "acquired", lock, lease_id: lease, token, waited_ms: grant.waited_ms });

let lost = false;
const renewer = setInterval(async () => {
  const [status, answer] = await call("POST", `/v1/leases/${lease}/keepalive`);
  if (status === 200) say({ step: "renewed", ttl_ms: answer.ttl_ms });
  else if (status === 404) {
    say({ step: "lost", error: answer.error });
    lost = true;
  }
  // Anything else (a node restarting): try again at the next turn.
}, TTL_MS / 3);

const end = Date.now() + seconds * 1000;
while (Date.now() < end && !lost) await sleep(50); // the work, passing `token` with every write
clearInterval(renewer);
if (lost) process.exit(2);
const [released, answer] = await call("POST", `${path}/release`, { lease_id: lease, token });
say({ step: "released", status: released, answer });
await call("DELETE", `/v1/leases/${lease}`);
