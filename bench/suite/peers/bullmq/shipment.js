// CSV validation, the same rules as Importer's domain/shipment.py: optional BOM,
// LF or CRLF, blank lines ignored, header sku,quantity (case-insensitive), a field
// may be wrapped in double quotes, SKU ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$, quantity
// digits 1..1,000,000, a SKU at most once, at most maxRows rows, issues capped at 100.
const SKU = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;
export const MAX_QUANTITY = 1000000;
const MAX_ISSUES = 100;
const decoder = new TextDecoder('utf-8', { fatal: true, ignoreBOM: false });

function unquote(field) {
  let f = field.trim();
  if (f.length >= 2 && f[0] === '"' && f[f.length - 1] === '"') f = f.slice(1, -1).trim();
  return f;
}

function digits(q) {
  // 1 to 7 ASCII digits -> their value, else -1 (the same as /^[0-9]{1,7}$/ then Number()).
  if (q.length < 1 || q.length > 7) return -1;
  let value = 0;
  for (let j = 0; j < q.length; j++) {
    const d = q.charCodeAt(j) - 48;
    if (d < 0 || d > 9) return -1;
    value = value * 10 + d;
  }
  return value;
}

// Returns { ok: true, rows: N, pairs: [sku, qty, sku, qty, ...] } or { ok: false, issues: [...] }.
export function parseShipment(data, maxRows = 100000) {
  let text;
  try {
    text = typeof data === 'string' ? data : decoder.decode(data);
  } catch {
    return { ok: false, issues: [{ line: 1, code: 'csv.not_utf8', message: 'not valid UTF-8' }] };
  }
  if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
  const issues = [];
  const add = (line, column, code, message) => { if (issues.length < MAX_ISSUES) issues.push({ line, column, code, message }); };
  const pairs = [];
  const seen = new Map();
  let header = false;
  let count = 0;
  let lineNo = 0;
  let start = 0;
  const end = text.length;
  while (start <= end) {
    let stop = text.indexOf('\n', start);
    if (stop === -1) stop = end;
    const next = stop + 1;
    lineNo += 1;
    if (stop > start && text.charCodeAt(stop - 1) === 13) stop -= 1;
    const line = text.slice(start, stop);
    start = next;
    if (!line.length || (line.charCodeAt(0) <= 32 && !line.trim())) continue;
    if (!header) {
      header = true;
      const names = line.split(',').map((f) => unquote(f).toLowerCase());
      if (names.length !== 2 || names[0] !== 'sku' || names[1] !== 'quantity') {
        return { ok: false, issues: [{ line: lineNo, code: 'csv.bad_header', message: "expected 'sku,quantity'" }] };
      }
      continue;
    }
    count += 1;
    if (count > maxRows) { add(lineNo, null, 'csv.too_many_rows', `more than ${maxRows} rows`); break; }
    if (issues.length >= MAX_ISSUES) continue;
    const comma = line.indexOf(',');
    if (comma === -1 || line.indexOf(',', comma + 1) !== -1) {
      add(lineNo, null, 'csv.bad_row', `${line.split(',').length} columns, expected 2`);
      continue;
    }
    // Plain fields (the usual case) need no unquoting: a valid SKU has no quote or space.
    let sku = line.slice(0, comma);
    if (!SKU.test(sku)) sku = unquote(sku);
    const qtyText = line.slice(comma + 1);
    let qty = digits(qtyText);
    if (qty < 0) qty = digits(unquote(qtyText));
    let ok = true;
    if (!SKU.test(sku)) { ok = false; add(lineNo, 1, 'csv.bad_sku', 'SKU is not valid'); }
    if (qty < 1 || qty > MAX_QUANTITY) { ok = false; add(lineNo, 2, 'csv.bad_quantity', `quantity is not a whole number from 1 to ${MAX_QUANTITY}`); }
    if (!ok) continue;
    const first = seen.get(sku);
    if (first !== undefined) { add(lineNo, 1, 'csv.duplicate_sku', `SKU ${sku} already on line ${first}`); continue; }
    seen.set(sku, lineNo);
    pairs.push(sku, qty);
  }
  if (!header) return { ok: false, issues: [{ line: 1, code: 'csv.empty', message: 'the file has no header and no rows' }] };
  if (issues.length) return { ok: false, issues };
  if (!pairs.length) return { ok: false, issues: [{ line: 1, code: 'csv.no_rows', message: 'the file has a header but no rows' }] };
  return { ok: true, rows: pairs.length / 2, pairs };
}
