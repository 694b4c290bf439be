// Bench helper: enqueue N 3-row imports through the same submitImport as the HTTP
// path, with no worker running. Usage: node enqueue.js N TAG [parallel]
import { connect } from './config.js';
import { createQueue, submitImport } from './queue.js';

const n = Number(process.argv[2]);
const tag = process.argv[3] || 'd';
const parallel = Number(process.argv[4] || 64);
const redis = connect('producer');
const queue = createQueue(redis);

const csv = (i) => Buffer.from(`sku,quantity\nA${i % 997},1\nB${i % 991},2\nC${i % 983},3\n`);
let next = 0;
async function lane() {
  while (next < n) {
    const i = next++;
    await submitImport(redis, queue, `${tag}-${i}`, csv(i));
  }
}
await Promise.all(Array.from({ length: parallel }, lane));
await queue.close();
await redis.quit();
console.log(`enqueued ${n}`);
