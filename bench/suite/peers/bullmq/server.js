// The seed's server.js on Node's http module: POST /api/imports?batchId=... (text/csv body)
// stores the upload and calls queue.add; GET /api/imports/:jobId reads the stored job;
// GET /health checks the closing flag and pings Redis. No owner check: the seed leaves it out.
import http from 'node:http';
import { connect, host, maxBytes, port } from './config.js';
import { BATCH_ID, createQueue, submitImport, submitImports } from './queue.js';

const redis = connect('producer');
const queue = createQueue(redis);
let closing = false;

function send(res, status, body, headers = {}) {
  const data = JSON.stringify(body);
  res.writeHead(status, {
    'Content-Type': status >= 400 ? 'application/problem+json' : 'application/json',
    'Content-Length': Buffer.byteLength(data),
    ...headers,
  });
  res.end(data);
}

function problem(res, status, code, detail) {
  send(res, status, { type: 'about:blank', title: http.STATUS_CODES[status], status, code, detail });
}

function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    req.on('data', (chunk) => {
      size += chunk.length;
      if (size > maxBytes) {
        reject(Object.assign(new Error('too large'), { status: 413 }));
        req.destroy();
        return;
      }
      chunks.push(chunk);
    });
    req.on('end', () => resolve(Buffer.concat(chunks, size)));
    req.on('error', reject);
  });
}

async function postImport(req, res, url) {
  const batchId = url.searchParams.get('batchId') || '';
  if (!BATCH_ID.test(batchId)) return problem(res, 422, 'request.invalid', 'batchId must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$');
  const declared = Number(req.headers['content-length'] || 0);
  if (declared > maxBytes) return problem(res, 413, 'request.too_large', `at most ${maxBytes} bytes`);
  const csv = await readBody(req);
  if (!csv.length) return problem(res, 422, 'csv.empty', 'the body is empty');
  const accepted = await submitImport(redis, queue, batchId, csv);
  return send(res, 202, accepted, { Location: `/api/imports/${accepted.jobId}` });
}

// POST /api/imports/bulk: NDJSON, one {batchId, csv} per line (as Importer's bulk
// intake takes it); one addBulk for all of them. 200 {results: [{status, body}]}.
async function postBulk(req, res) {
  const body = await readBody(req);
  const shipments = [];
  for (const line of body.toString('utf8').split('\n')) {
    if (!line.trim()) continue;
    const { batchId, csv } = JSON.parse(line);
    if (!BATCH_ID.test(batchId || '')) return problem(res, 422, 'request.invalid', 'a line has a bad batchId');
    shipments.push({ batchId, csv: Buffer.from(csv) });
  }
  if (!shipments.length || shipments.length > 1000) return problem(res, 422, 'request.invalid', '1 to 1000 lines');
  return send(res, 200, { results: await submitImports(redis, queue, shipments) });
}

async function getImport(res, jobId) {
  const job = await queue.getJob(jobId);
  if (!job) return problem(res, 404, 'job.not_found', 'no such job (it may have been removed by retention)');
  const state = await job.getState();
  return send(res, 200, {
    id: job.id,
    state,
    progress: job.progress,
    result: job.returnvalue ?? null,
    error: job.failedReason ?? null,
    attempt: job.attemptsMade,
  });
}

async function health(res) {
  if (closing) return problem(res, 503, 'service.closing', 'shutting down');
  try {
    await redis.ping();
  } catch {
    return problem(res, 503, 'redis.unavailable', 'Redis does not answer');
  }
  return send(res, 200, { status: 'ok' });
}

const server = http.createServer((req, res) => {
  const url = new URL(req.url, 'http://peer');
  let work;
  if (req.method === 'POST' && url.pathname === '/api/imports/bulk') work = postBulk(req, res);
  else if (req.method === 'POST' && url.pathname === '/api/imports') work = postImport(req, res, url);
  else if (req.method === 'GET' && url.pathname.startsWith('/api/imports/')) work = getImport(res, decodeURIComponent(url.pathname.slice(13)));
  else if (req.method === 'GET' && url.pathname === '/health') work = health(res);
  else work = Promise.resolve(problem(res, 404, 'route.not_found', 'no such route'));
  work.catch((err) => {
    if (res.headersSent) return;
    if (err.status === 413) problem(res, 413, 'request.too_large', `at most ${maxBytes} bytes`);
    else {
      console.error('request_error', err.message);
      problem(res, 503, 'service.unavailable', 'try again later');
    }
  });
});
server.keepAliveTimeout = 65000;
server.listen(port, host, () => console.log(`peer server listening on http://${host}:${port}`));

async function shutdown() {
  if (closing) return;
  closing = true;
  const closed = new Promise((resolve) => server.close(resolve));
  server.closeIdleConnections();
  await closed;
  await queue.close();
  await redis.quit();
}
process.on('SIGTERM', () => shutdown().catch(console.error));
process.on('SIGINT', () => shutdown().catch(console.error));
