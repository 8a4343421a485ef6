// Preloaded into Portkey's gateway by proxy_bench.py --portkey (node --import): Node 20's fetch returns responses whose
// headers are immutable, and the gateway appends its own to them (every request a 500, "TypeError: immutable").
// A copy with mutable headers, same status and the same streaming body.
const upstreamFetch = globalThis.fetch;
globalThis.fetch = async (...args) => {
  const r = await upstreamFetch(...args);
  return new Response(r.body, { status: r.status, statusText: r.statusText, headers: new Headers(r.headers) });
};
