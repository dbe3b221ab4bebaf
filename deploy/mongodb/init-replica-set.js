// One-time set-up of the replica set rs0 and of what chat-delivery needs in it.
// Safe to run again: every step checks before it acts.
//
// Production (authorization on, no users yet): run ON mongo1, over loopback,
// so the localhost exception lets us initiate and create the first user:
//
//   MONGO_ADMIN_PASSWORD=... CHAT_MONGO_PASSWORD=... \
//     mongosh --quiet "mongodb://127.0.0.1:27017/?directConnection=true" --file init-replica-set.js
//
// A second run must authenticate as that admin (same variables: the script
// logs in with MONGO_ADMIN_PASSWORD when users already exist).
// compose.yaml runs it from the mongo-init service (no authorization there).

const RS_NAME = "rs0";
// The names clients will use: the driver learns the members from this config,
// so every API and daemon host must resolve mongo1..3 exactly as written here.
const MEMBERS = ["mongo1:27017", "mongo2:27017", "mongo3:27017"];
// Must equal CHAT_RETENTION_SECONDS: db.init creates the same index and gets
// IndexOptionsConflict if expireAfterSeconds differs.
const RETENTION_SECONDS = Number(process.env.CHAT_RETENTION_SECONDS || 86400);
const PRIMARY_WAIT_MS = 120 * 1000;

function need(name) {
  const value = process.env[name];
  if (!value) throw new Error(`set ${name} in the environment (never in this file)`);
  return value;
}

const admin = db.getSiblingDB("admin");
const adminPassword = process.env.MONGO_ADMIN_PASSWORD;

function login() {
  try {
    return admin.auth("admin", adminPassword).ok === 1;
  } catch (e) {
    return false; // first run: the user does not exist yet
  }
}

// On a re-run with authorization on, everything below needs the admin login.
let loggedIn = Boolean(adminPassword) && login();

// ---- 1. the replica set ----------------------------------------------------
function initiated() {
  try {
    rs.status();
    return true;
  } catch (e) {
    if (e.code === 94 /* NotYetInitialized */) return false;
    throw e;
  }
}

if (!initiated()) {
  // mongo1 gets the higher priority so that it (the member this script talks
  // to) becomes PRIMARY, and so that writes move back to it after maintenance.
  rs.initiate({
    _id: RS_NAME,
    members: MEMBERS.map((host, i) => ({ _id: i, host: host, priority: i === 0 ? 2 : 1 })),
  });
  print(`initiated ${RS_NAME} with ${MEMBERS.join(", ")}`);
}

// ---- 2. wait until this member is PRIMARY -----------------------------------
const deadline = Date.now() + PRIMARY_WAIT_MS;
while (!db.hello().isWritablePrimary) {
  if (Date.now() > deadline) throw new Error(`no PRIMARY after ${PRIMARY_WAIT_MS / 1000} s`);
  sleep(1000);
}
print("this member is PRIMARY");

// ---- 3. the administrator (only where authorization is on) ------------------
if (adminPassword && !loggedIn) {
  // Users can only be created on the PRIMARY, hence after step 2. The
  // localhost exception allows exactly this first user and closes after it.
  admin.createUser({ user: "admin", pwd: adminPassword, roles: ["root"] });
  print("created user admin");
  loggedIn = login();
  if (!loggedIn) throw new Error("cannot log in as the admin user just created");
}

// ---- 4. chat.messages and its indexes ---------------------------------------
const chat = db.getSiblingDB("chat");
if (!chat.getCollectionNames().includes("messages")) {
  chat.createCollection("messages");
}
// Catch-up reads "messages to or from U after id S": one index per side.
chat.messages.createIndex({ to: 1, _id: 1 }, { name: "to_id" });
chat.messages.createIndex({ from: 1, _id: 1 }, { name: "from_id" });
// The 24 h retention. The TTL monitor runs every 60 s; the API's sweeper
// still records the retention floor the daemons use for `recovered: false`.
chat.messages.createIndex({ created_at: 1 }, { name: "created_at_ttl", expireAfterSeconds: RETENTION_SECONDS });
print(`chat.messages ready (TTL ${RETENTION_SECONDS} s)`);

// ---- 5. the application user ------------------------------------------------
// One user for API, daemons and db.init. It lives in `admin` because the
// CHAT_MONGO_URL has no database path, so the driver authenticates there.
// read on `local`: the daemons tail local.oplog.rs (and db.init lists it).
const appRoles = [
  { role: "readWrite", db: "chat" },
  { role: "read", db: "local" },
];
const appPassword = need("CHAT_MONGO_PASSWORD");
if (admin.getUser("chat_app") === null) {
  admin.createUser({ user: "chat_app", pwd: appPassword, roles: appRoles });
  print("created user chat_app");
} else {
  admin.updateUser("chat_app", { pwd: appPassword, roles: appRoles });
  print("updated user chat_app");
}

// ---- 6. cluster-wide default write concern ----------------------------------
// MongoDB 5.0+ already defaults to majority on a 3-member set; saying it
// explicitly keeps it so if an arbiter is ever added and guards any client
// that forgets w=majority in its URL. The default READ concern is left alone
// on purpose: the daemons' oplog tail and their reads of chat.messages must
// use the same read concern (see README.md, "Rollback").
printjson(db.adminCommand({ setDefaultRWConcern: 1, defaultWriteConcern: { w: "majority" } }));
print("done");
