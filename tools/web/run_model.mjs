// Runs ONNX models the way transformers.js does (ort.InferenceSession.create on the model's bytes, ort.Tensor
// feeds, session.run), with onnxruntime-web's wasm backend (what the browser build runs without WebGPU; in Node,
// onnxruntime-web serves the same wasm build) or with onnxruntime-node (transformers.js under Node), and writes
// the outputs back as raw little-endian files with a JSON manifest, for tools/runtime_check.py to compare.
//
//   node tools/web/run_model.mjs --backend wasm --inputs DIR/inputs.json --out OUT [--warmup 2] [--repeat 10]
//                                [--threads 1] MODEL.onnx [MODEL.onnx ...]
//
// inputs.json: {"samples": [{"NAME": {"dtype": "float32", "shape": [1, 8], "file": "s0-0.bin"}, ...}, ...]},
// files relative to the manifest. OUT/result.json: {"backend", "versions", "models": [{"path", "error" | "outputs":
// [sample -> {"NAME": {"dtype", "shape", "file"}}], "times_ms"}]}. Timing runs the first sample, every model once
// per round (so a ratio between two models is measured in one run, under the same load). A model that
// fails to load or run gets an "error" and the others still run; a bad command line exits 2 with one line.
import fs from 'node:fs';
import path from 'node:path';

const BACKENDS = { wasm: 'onnxruntime-web', node: 'onnxruntime-node' };
// onnxruntime-common's tensor types and the typed arrays holding them (float16 as raw bits, as ORT takes it where
// the JavaScript engine has no Float16Array: Node 20).
const ARRAYS = {
  float32: Float32Array,
  float64: Float64Array,
  float16: Uint16Array,
  int8: Int8Array,
  uint8: Uint8Array,
  int16: Int16Array,
  uint16: Uint16Array,
  int32: Int32Array,
  uint32: Uint32Array,
  int64: BigInt64Array,
  uint64: BigUint64Array,
  bool: Uint8Array,
};

function fail(message) {
  process.stderr.write(`run_model: ${message}\n`);
  process.exit(2);
}

function parseArgs(argv) {
  const args = { backend: null, inputs: null, out: null, warmup: 2, repeat: 10, threads: 1, models: [] };
  const numbers = new Set(['warmup', 'repeat', 'threads']);
  for (let i = 0; i < argv.length; i += 1) {
    const flag = argv[i];
    if (!flag.startsWith('--')) {
      args.models.push(flag);
      continue;
    }
    const key = flag.slice(2);
    if (!(key in args) || key === 'models') fail(`unknown flag ${flag}`);
    const value = argv[(i += 1)];
    if (value === undefined) fail(`${flag} needs a value`);
    if (numbers.has(key)) {
      const number = Number(value);
      if (!Number.isInteger(number) || number < (key === 'threads' ? 1 : 0)) fail(`${flag} must be an integer, got ${value}`);
      args[key] = number;
    } else {
      args[key] = value;
    }
  }
  if (!(args.backend in BACKENDS)) fail(`--backend must be one of ${Object.keys(BACKENDS).join(', ')}`);
  if (!args.inputs || !args.out) fail('--inputs and --out are required');
  if (!args.models.length) fail('no model given');
  for (const model of args.models) if (!fs.existsSync(model)) fail(`model not found: ${model}`);
  return args;
}

function readTensor(ort, dir, entry) {
  const Array_ = ARRAYS[entry.dtype];
  if (!Array_) throw new Error(`unsupported element type ${entry.dtype}`);
  const bytes = fs.readFileSync(path.join(dir, entry.file));
  // A copy: the typed array must start at an offset aligned to its element size.
  const data = new Array_(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
  return new ort.Tensor(entry.dtype, data, entry.shape);
}

function writeTensor(dir, file, tensor) {
  const data = tensor.data;
  fs.writeFileSync(path.join(dir, file), Buffer.from(data.buffer, data.byteOffset, data.byteLength));
  return { dtype: tensor.type, shape: Array.from(tensor.dims), file };
}

function loadSamples(ort, manifestPath) {
  const dir = path.dirname(manifestPath);
  const manifest = JSON.parse(fs.readFileSync(manifestPath, 'utf8'));
  return manifest.samples.map((sample) =>
    Object.fromEntries(Object.entries(sample).map(([name, entry]) => [name, readTensor(ort, dir, entry)])),
  );
}

async function runAll(ort, sessions, samples, out) {
  for (const [index, item] of sessions.entries()) {
    if (item.error) continue;
    try {
      item.outputs = [];
      for (const [s, feeds] of samples.entries()) {
        const results = await item.session.run(feeds);
        const written = {};
        for (const name of item.session.outputNames) {
          written[name] = writeTensor(out, `m${index}-s${s}-${item.session.outputNames.indexOf(name)}.bin`, results[name]);
        }
        item.outputs.push(written);
      }
    } catch (err) {
      item.error = `failed to run: ${err.message ?? err}`;
    }
  }
}

// Every model once per round, starting one model later each round (a model run first in a round, after the
// others' caches, is not always the same one).
async function time(sessions, feeds, warmup, repeat) {
  const live = sessions.filter((item) => !item.error);
  for (const item of live) item.times_ms = [];
  for (let round = 0; round < warmup + repeat; round += 1) {
    for (let step = 0; step < live.length; step += 1) {
      const item = live[(round + step) % live.length];
      const start = performance.now();
      await item.session.run(feeds);
      if (round >= warmup) item.times_ms.push(performance.now() - start);
    }
  }
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  let ort;
  try {
    ort = await import(BACKENDS[args.backend]);
  } catch (err) {
    fail(`${BACKENDS[args.backend]} cannot be loaded (${err.code ?? err.message}); install it: cd tools/web && npm ci --ignore-scripts`);
  }
  const options = { executionProviders: [args.backend === 'wasm' ? 'wasm' : 'cpu'], graphOptimizationLevel: 'all' };
  if (args.backend === 'wasm') {
    ort.env.wasm.numThreads = args.threads;
  } else {
    options.intraOpNumThreads = args.threads;
    options.interOpNumThreads = 1;
  }
  const samples = loadSamples(ort, args.inputs);
  fs.mkdirSync(args.out, { recursive: true });
  const sessions = [];
  for (const model of args.models) {
    try {
      sessions.push({ path: model, session: await ort.InferenceSession.create(fs.readFileSync(model), options) });
    } catch (err) {
      sessions.push({ path: model, error: `failed to load: ${err.message ?? err}` });
    }
  }
  await runAll(ort, sessions, samples, args.out);
  if (samples.length) await time(sessions, samples[0], args.warmup, args.repeat);
  const result = {
    backend: args.backend,
    versions: { ...ort.env.versions, node: process.versions.node },
    threads: args.threads,
    models: sessions.map(({ path: model, error, outputs, times_ms: times }) => ({ path: model, error, outputs, times_ms: times })),
  };
  fs.writeFileSync(path.join(args.out, 'result.json'), JSON.stringify(result, null, 1));
  for (const { session } of sessions) if (session) await session.release();
}

try {
  await main();
} catch (err) {
  process.stderr.write(`run_model: ${err.stack ?? err}\n`);
  process.exit(1);
}
